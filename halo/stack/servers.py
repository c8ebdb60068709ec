"""The server entrypoints' command lines, as images/<server>/serve.sh builds them.

serve.sh is run with a real POSIX sh in its --print-command mode, with every variable it
reads set, so that every flag it can emit is in the argv handed to the real parser.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from halo.errors import HaloError

# A value for every variable the entrypoints read (HALO_EXTRA_ARGS is the user's own).
SAMPLE_ENV = {
    "vllm": {
        "HALO_MODEL": "/models/tiny",
        "HALO_SERVED_MODEL_NAME": "tiny",
        "HALO_HOST": "127.0.0.1",
        "HALO_PORT": "8001",
        "HALO_TP_SIZE": "2",
        "HALO_DP_SIZE": "2",
        "HALO_PP_SIZE": "1",
        "HALO_LOG_LEVEL": "WARN",
        "HALO_GPU_MEMORY_UTILIZATION": "0.85",
        "HALO_MAX_MODEL_LEN": "4096",
        "VLLM_REASONING_PARSER": "qwen3",
        # `vllm serve`; the CPU server's `module` form runs for real in the rollout tier.
        "HALO_VLLM_ENTRYPOINT": "cli",
    },
    "sglang": {
        "HALO_MODEL": "/models/tiny",
        "HALO_SERVED_MODEL_NAME": "tiny",
        "HALO_HOST": "127.0.0.1",
        "HALO_PORT": "30001",
        "HALO_TP_SIZE": "2",
        "HALO_DP_SIZE": "2",
        "HALO_PP_SIZE": "1",
        "HALO_LOG_LEVEL": "WARN",
        "HALO_MEM_FRACTION_STATIC": "0.8",
        "HALO_CONTEXT_LENGTH": "4096",
        "HALO_NNODES": "2",
        "HALO_NODE_RANK": "1",
        "HALO_DIST_INIT_ADDR": "127.0.0.1:29500",
        "HALO_REASONING_PARSER": "qwen3",
    },
}
NOT_FLAGS = frozenset({"HALO_EXTRA_ARGS", "HALO_DRY_RUN"})
_READS = re.compile(r"\$\{((?:HALO|VLLM)_[A-Z0-9_]+)[:}-]")


def serve_script(images: Path, server: str) -> Path:
    return images / server / "serve.sh"


def unset_variables(script: Path, server: str) -> list[str]:
    """Flag-shaping variables the script reads that SAMPLE_ENV leaves unset."""
    reads = set(_READS.findall(script.read_text()))
    passed_through = {"VLLM_USE_V2_MODEL_RUNNER", "VLLM_LOGGING_LEVEL"}  # env, not flags
    return sorted(reads - SAMPLE_ENV[server].keys() - NOT_FLAGS - passed_through)


def server_argv(script: Path, server: str) -> list[str]:
    """The command serve.sh would exec, without the `env K=V` prefix it prints."""
    proc = subprocess.run(
        ["sh", str(script), "--print-command"],
        env={"PATH": "/usr/bin:/bin", **SAMPLE_ENV[server]},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise HaloError(
            f"{script}: --print-command exited {proc.returncode}: {proc.stderr.strip()}"
        )
    words = shlex.split(proc.stdout)
    if not words or words[0] != "env":
        raise HaloError(f"{script}: --print-command printed {proc.stdout.strip()!r}")
    words = words[1:]
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    return words
