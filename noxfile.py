"""Every job is a nox session. Sessions are thin: they call `halo ...` commands."""

from __future__ import annotations

import hashlib
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "pins-check", "test-toolchain"]

PYTHON = "3.11"
IMAGES = ("cpu", "blackwell", "hopper", "vllm", "sglang")
STACK_SETS = ("blackwell", "hopper", "vllm", "sglang")


def _halo(session: nox.Session) -> None:
    """Install the toolchain (editable) and the dev tools, once per pyproject.toml.

    An editable install follows source changes by itself, so a venv whose stamp matches
    pyproject.toml is left alone: that keeps `nox -s build-cpu` on an up-to-date image fast.
    pip comes along because fetch asks it for its default index when none is configured.
    """
    venv = getattr(session.virtualenv, "location", None)
    stamp = Path(venv, ".halo-installed") if venv else None
    want = hashlib.sha256(Path("pyproject.toml").read_bytes()).hexdigest()
    if stamp and stamp.is_file() and stamp.read_text() == want:
        return
    session.install("-e", ".", "--group", "dev", "pip", silent=True)
    if stamp:
        stamp.write_text(want)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("--group", "dev", silent=True)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def fmt(session: nox.Session) -> None:
    """Apply ruff's fixes and formatting."""
    session.install("--group", "dev", silent=True)
    session.run("ruff", "check", "--fix", ".")
    session.run("ruff", "format", ".")


@nox.session(python=PYTHON)
def lock(session: nox.Session) -> None:
    """Re-resolve pin sets into pins/pylock.<set>.toml (all sets, or those named after --)."""
    _halo(session)
    session.run("halo", "pins", "lock", *session.posargs)


@nox.session(name="lock-check", python=PYTHON)
def lock_check(session: nox.Session) -> None:
    """Re-resolve and fail with a diff where a lock drifted from its inputs."""
    _halo(session)
    session.run("halo", "pins", "lock", "--check", *session.posargs)


@nox.session(name="pins-check", python=PYTHON)
def pins_check(session: nox.Session) -> None:
    """The cross-set invariants (offline)."""
    _halo(session)
    session.run("halo", "pins", "check", *session.posargs)


@nox.session(python=PYTHON)
def fetch(session: nox.Session) -> None:
    """Download a set's artifacts into the content-addressed store (default: cpu)."""
    _halo(session)
    session.run("halo", "fetch", *(session.posargs or ["cpu"]))


def _build(name: str) -> None:
    @nox.session(name=f"build-{name}", python=PYTHON)
    def build(session: nox.Session) -> None:
        _halo(session)
        session.run("halo", "image", "build", name, *session.posargs)

    build.__doc__ = (
        f"Build the {name} image hermetically (fetch, then docker build --network none)."
    )


for _name in IMAGES:
    _build(_name)


@nox.session(name="build-all", python=PYTHON)
def build_all(session: nox.Session) -> None:
    """Build every image in dependency order."""
    _halo(session)
    session.run("halo", "image", "build", "--all", *session.posargs)


@nox.session(python=PYTHON)
def plan(session: nox.Session) -> None:
    """Print an image's build plan without Docker (default: every image)."""
    _halo(session)
    session.run("halo", "image", "plan", *(session.posargs or ["--all"]))


@nox.session(name="test-toolchain", python=PYTHON)
def test_toolchain(session: nox.Session) -> None:
    """Toolchain tests on the host (locks, store, images, patches, CI rendering)."""
    _halo(session)
    session.run("pytest", "tests/toolchain", *session.posargs)


def _tier(tier: str, image: str) -> None:
    @nox.session(name=f"test-{tier}", python=PYTHON)
    def run_tier(session: nox.Session) -> None:
        _halo(session)
        where = [] if {"--native", "--image"} & set(session.posargs) else ["--image", image]
        session.run("halo", "test", tier, *where, *session.posargs)

    run_tier.__doc__ = f"The {tier} tier inside {image} (add -- --native to run on this host)."


for _tier_name, _image in (
    ("cpu", "cpu"),
    ("gpu-core", "blackwell"),
    ("gpu-full", "blackwell"),
    ("rollout-vllm", "blackwell"),
    ("rollout-sglang", "blackwell"),
):
    _tier(_tier_name, _image)


@nox.session(name="stack-check", python=PYTHON)
def stack_check(session: nox.Session) -> None:
    """Install GPU locks as their images do and prove them, no GPU (-- SET... [halo stack verify options]).

    Default: every GPU set, the CPU tier natively on blackwell. The wheels come from the store
    (fetched here first); the venvs live under $HALO_STACK_VENVS or <scratch>/stacks.
    """
    _halo(session)
    args = list(session.posargs) or [*STACK_SETS, "--cpu-tier", "blackwell"]
    first_option = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    sets = args[:first_option] or list(STACK_SETS)
    session.run("halo", "fetch", *sets)
    session.run("halo", "stack", "verify", *sets, *args[first_option:])


@nox.session(python=PYTHON)
def patches(session: nox.Session) -> None:
    """Verify the patches against an image's environment (default halo:cpu) or -- --site DIR."""
    _halo(session)
    session.run("halo", "patches", "verify", *(session.posargs or ["--image", "cpu"]))


@nox.session(python=PYTHON)
def example(session: nox.Session) -> None:
    """The main job: build halo:cpu and train the tiny SFT example inside it."""
    _halo(session)
    session.run("halo", "image", "build", "cpu")
    session.run("halo", "example", "--image", "cpu", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks with budgets: no-op build, pins check, lock check, trainer throughput."""
    _halo(session)
    session.run("python", "ci/bench.py", *session.posargs)


@nox.session(name="ci-render", python=PYTHON)
def ci_render(session: nox.Session) -> None:
    """Render ci/matrix.yaml into the workflow (-- --check to compare instead)."""
    _halo(session)
    session.run("halo", "ci", "render", *session.posargs)


@nox.session(python=PYTHON)
def ci(session: nox.Session) -> None:
    """Everything CI runs on a machine without a GPU, in order."""
    _halo(session)
    session.notify("lint")
    session.notify("pins-check")
    session.notify("lock-check", ["cpu"])
    session.notify("ci-render", ["--check"])
    # build-cpu first, so the log shows the base made, the artifacts fetched and verified and
    # the offline build; the toolchain tests then find halo:cpu up to date.
    session.notify("build-cpu")
    session.notify("test-toolchain")
    session.notify("test-cpu")
    # The GPU stacks installed as their images install them, proven without a GPU, one venv at
    # a time (about 6 GB each, removed once checked); the CPU tier also runs on blackwell's.
    session.notify("stack-check", [*STACK_SETS, "--cpu-tier", "blackwell", "--clean"])
    session.notify("patches")
    session.notify("plan")
    session.notify("bench")
