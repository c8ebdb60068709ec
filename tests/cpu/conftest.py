"""Helpers for the CPU tier: run `halo` in a subprocess exactly as a user would, or the
trainer in this process where a test only needs its result."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# The tier runs one pytest worker per core: a trainer (in a worker or a subprocess it starts)
# that also spins up one OpenMP thread per core oversubscribes the machine, and on a busy
# two-core box a step then takes several times longer. Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TOKENIZER = EXAMPLES / "tokenizer"

# Tiny models of two families, as examples/make_tokenizer.py writes them (head_dim 64, as
# vLLM's CPU attention needs); the tests build them fresh from these fields.
ARCH = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "max_position_embeddings",
    "tie_word_embeddings",
)


def _tiny(name: str) -> dict[str, Any]:
    conf = json.loads((EXAMPLES / "models" / name / "config.json").read_text())
    return {k: conf[k] for k in ARCH}


TINY = {"llama": _tiny("tiny-llama"), "qwen3": _tiny("tiny-qwen3")}


def halo_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("HALO_TEST_HOOK_CHECKPOINT_SLEEP", None)
    env.update(extra)
    return env


def halo_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "halo", *args]


def run_halo(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        halo_cmd(*args),
        env=halo_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def run_halo_without(
    modules: list[str], *args: str, timeout: float = 300, forbid: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    """`halo ARGS` with ``modules`` unimportable (``sys.modules[name] = None``), as on a host
    that lacks them: a login node has halo and the tokenizer libraries, and no torch.

    ``forbid``: importing one of them is an error instead (RuntimeError, which no optional
    import catches): for what must answer before it would import them at all."""
    absent = f"for name in {modules!r}:\n    sys.modules[name] = None\n"
    forbidden = (
        "class Forbid:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.partition('.')[0] in {modules!r}:\n"
        "            raise RuntimeError(f'imported {name}')\n"
        "sys.meta_path.insert(0, Forbid())\n"
    )
    code = (
        "import sys\n" + (forbidden if forbid else absent) + "from halo.cli import main\n"
        f"raise SystemExit(main({list(args)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=halo_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def outputs(tmp: Path) -> list[str]:
    """Overrides that send a run's checkpoints and logs under ``tmp``."""
    return [f"--runtime.paths.checkpoints={tmp / 'ck'}", f"--runtime.paths.logs={tmp / 'logs'}"]


def model_override(family: str) -> str:
    return f"--model.config={json.dumps(TINY[family])}"


def train_here(method: str, config: Path, tmp: Path, *extra: str) -> tuple[int, str]:
    """The trainer's process entry, in this process: (exit code, what it printed)."""
    from halo.errors import HaloError
    from halo.train import run
    from halo.train.loop.stopping import StopFlag

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            rc = run.run(method, config, [*outputs(tmp), *extra], StopFlag())
        except HaloError as exc:
            print(f"halo: error: {exc.message}")
            rc = exc.exit_code
    return rc, out.getvalue()


def metrics(tmp: Path, job: str) -> list[dict[str, Any]]:
    path = tmp / "logs" / job / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from halo.train.data.tokenizer import load

    return load(str(TOKENIZER))


@pytest.fixture
def sft_config() -> Path:
    return EXAMPLES / "sft" / "config.yaml"


@pytest.fixture
def grpo_config() -> Path:
    return EXAMPLES / "grpo" / "config.yaml"
