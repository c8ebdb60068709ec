"""The model section checked by the transformers config class of its model_type: an unknown
key is named with the nearest valid one, sizes are >= 1, probabilities in [0, 1], and what the
class or the model's constructor rejects is one line; each is exit 2 before anything starts.
Data mixing: interleave_under stops at the first exhausted source, interleave_over when every
source has been seen whole."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from halo.train import config
from halo.train.config import Source
from halo.train.data import batching

from .conftest import EXAMPLES, halo_env, outputs, run_halo

pytestmark = pytest.mark.cpu

SFT = EXAMPLES / "sft" / "config.yaml"


def main_here(method: str, cfg: Path, tmp: Path, *extra: str) -> tuple[int, str]:
    """The trainer's entry (python -m halo.train.run) in this process: (exit code, its one
    error line). Its signal handlers are put back afterwards."""
    from halo.train import run

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = run.main(["--method", method, "--config", str(cfg), *outputs(tmp), *extra])
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    text = err.getvalue()
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("halo: error: "), text
    return rc, lines[0]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "--model.config.num_hiden_layers=3",
            "model.config.num_hiden_layers: not a field of LlamaConfig; did you mean "
            "num_hidden_layers?",
        ),
        ("--model.config.nonsense_key=3", "model.config.nonsense_key: not a field of LlamaConfig"),
        (
            "--model.config.num_hidden_layers=0",
            "model.config.num_hidden_layers: expected a size >= 1, got 0",
        ),
        (
            "--model.config.num_hidden_layers=-1",
            "model.config.num_hidden_layers: expected a size >= 1, got -1",
        ),
        (
            "--model.config.intermediate_size=0",
            "model.config.intermediate_size: expected a size >= 1, got 0",
        ),
        (
            "--model.config.attention_dropout=1.5",
            "model.config.attention_dropout: expected a probability in [0, 1], got 1.5",
        ),
        (
            "--model.config.num_attention_heads=3",
            "model.config: not a usable model config (Class validation error",
        ),
    ],
)
def test_the_model_section_is_checked_by_its_class(
    tmp_path: Path, override: str, expected: str
) -> None:
    rc, line = main_here("sft", SFT, tmp_path, override)
    assert rc == 2 and expected in line, line
    assert not (tmp_path / "ck").exists()  # nothing started: not even the job folder


def test_legacy_names_the_class_consumes_are_not_unknown() -> None:
    # rope_theta is turned into rope_parameters by the class: a valid name.
    cfg = config.load(SFT, "sft", ["--model.config.rope_theta=500000.0"])
    assert cfg.model.config is not None and cfg.model.config["rope_theta"] == 500000.0


def test_a_constructor_rejection_is_one_line(tmp_path: Path) -> None:
    # The config class takes any activation name; the model's constructor does not.
    rc, line = main_here("sft", SFT, tmp_path, "--model.config.hidden_act=no-such-activation")
    assert rc == 2 and "model.config: cannot build the model" in line, line


def test_a_launch_with_an_unknown_key_is_refused_before_anything_runs(tmp_path: Path) -> None:
    # `halo launch` itself (a dry run here, which would print the command it starts): the
    # config is refused before any trainer process or command exists.
    from halo.cli import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(["launch", "sft", str(SFT), "--dry-run", "--", *outputs(tmp_path),
                   "--model.config.num_hiden_layers=2"])  # fmt: skip
    assert rc == 2 and out.getvalue() == "", out.getvalue()
    (line,) = err.getvalue().strip().splitlines()
    assert line.startswith("halo: error: ") and line.endswith("did you mean num_hidden_layers?")
    assert list(tmp_path.iterdir()) == []


def test_a_launch_of_one_process_imports_no_torch_before_it_becomes_the_trainer(
    tmp_path: Path,
) -> None:
    # The launcher execs the trainer, which checks model.config against its class and the
    # mesh against the model before anything starts. The launcher asking transformers too (and
    # torch with it) cost each such launch ~3 s of CPU, 29 s under qemu. Here execve prints
    # what was imported by then instead of replacing the process.
    args = ["launch", "sft", str(SFT), "--", *outputs(tmp_path), "--training.max_steps=1"]
    code = (
        "import os, sys\n"
        "def execve(path, argv, env):\n"
        "    print(sorted({'torch', 'transformers'} & set(sys.modules)), *argv[1:5])\n"
        "    raise SystemExit(0)\n"
        "os.execve = execve\n"
        "from halo.cli import main\n"
        f"raise SystemExit(main({args!r}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=halo_env(), capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "-m", "halo.train.run", "--method", "sft"], r.stdout


def test_a_launch_of_one_process_refuses_an_unknown_key_in_one_line_after_exec(
    tmp_path: Path,
) -> None:
    r = run_halo("launch", "sft", str(SFT), "--", *outputs(tmp_path),
                 "--model.config.num_hiden_layers=2")  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("halo: error: ") and last.endswith("did you mean num_hidden_layers?")
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing started: not even the job folder


def nothing_written(job_dir: Path) -> bool:
    """No checkpoint, no partial, no lock: at most the empty job folder the lock was in."""
    return not job_dir.exists() or not any(job_dir.iterdir())


A = [("a", i) for i in range(10)]
B = [("b", i) for i in range(3)]


def counts(mixed: list[tuple[str, int]]) -> tuple[int, int]:
    return sum(1 for s, _ in mixed if s == "a"), sum(1 for s, _ in mixed if s == "b")


@pytest.mark.parametrize("seed", range(5))
def test_interleave_under_stops_when_the_first_source_is_exhausted(seed: int) -> None:
    mixed = batching.interleave([A, B], [0.5, 0.5], seed)
    a, b = counts(mixed)
    # It ends on the last example of the source that ran out, and nothing repeats.
    assert mixed[-1] in (A[-1], B[-1])
    assert (a == len(A)) != (b == len(B)) and a <= len(A) and b <= len(B)
    assert len(set(mixed)) == len(mixed)


@pytest.mark.parametrize("seed", range(5))
def test_interleave_over_stops_when_every_source_was_seen_whole(seed: int) -> None:
    mixed = batching.interleave([A, B], [0.5, 0.5], seed, oversample=True)
    a, b = counts(mixed)
    assert set(A) | set(B) == set(mixed)  # nothing left out
    assert a >= len(A) and b >= len(B) and b > len(B)  # the small source oversampled
    # It stops at the draw that exhausts the last source not yet seen whole.
    last = mixed[-1]
    source = A if last[0] == "a" else B
    assert last == source[-1] and set(mixed[:-1]) != set(A) | set(B)
    # The draws (and so the order) are the same as undersampling's up to its stop.
    under = batching.interleave([A, B], [0.5, 0.5], seed)
    assert mixed[: len(under)] == under


def test_both_mixes_load_from_the_config(tmp_path: Path) -> None:
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    row = '{"prompt": "p%d", "completion": "c"}\n'
    big.write_text("".join(row % i for i in range(40)))
    small.write_text("".join(row % (100 + i) for i in range(5)))
    sizes = {}
    for mix in ("interleave_under", "interleave_over", "interleave"):
        d = config.Data(
            train=[Source(path=big, probability=0.5), Source(path=small, probability=0.5)], mix=mix
        )
        train, _ = batching.load(d, 0, lambda r, f, s, w: r["prompt"])
        sizes[mix] = len(train)
        prompts = set(train)
        if mix == "interleave_over":
            assert prompts == {f"p{i}" for i in range(40)} | {f"p{100 + i}" for i in range(5)}
        else:
            assert len(train) < 45 and len(prompts) == len(train)
    assert sizes["interleave"] == sizes["interleave_under"] < 45 < sizes["interleave_over"]
    with pytest.raises(Exception, match="mix"):
        config.Data(train=big, mix="interleave_sideways")
