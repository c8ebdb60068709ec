"""The one place that knows how a Halo image is run: `docker run` flags for tiers and jobs.

Shared by the test tiers, `halo example` and `make train` (`halo run`):

- always: `--rm --init --pull never`, the host's user (or one asked for; `read_only` adds
  `--read-only` and a /tmp tmpfs, as Enroot and Apptainer run images), the checkout at /workspace (read-only
  unless a job writes there), $HALO_SCRATCH at /scratch holding HOME, the Hugging Face
  caches (HF_HOME, HF_DATASETS_CACHE), TMPDIR and HALO_DATA_ROOT; `--ipc=host` and shm.
- GPU images (a catalog entry with CUDA architectures): `--gpus all`, unlimited locked memory
  and a 64 MiB stack (NCCL and RDMA pin memory), CUDA_DEVICE_MAX_CONNECTIONS=1 (overlapping
  communication and compute with FSDP needs kernels issued in order).
- credentials only when asked (a training job) and never in CI: `--env-file .env` and
  `~/.aws` (read-only, at the container's $HOME/.aws, where boto3 and the AWS CLI look), each
  only when present; a run may name other ones or none (`make train ENV_FILE= AWS_DIR=`).
  Only their paths reach the command line, never what they hold. Nothing else from the
  host's environment.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from halo.images.docker import Docker
from halo.paths import find_repo, scratch_root

WORKSPACE = "/workspace"
SCRATCH = "/scratch"
PYCACHE = "/tmp/halo-pycache"
# The images ship no bytecode, so every process would compile torch's and transformers'
# sources on import (~3 s of CPU each; a tier starts hundreds). In a container: bytecode under
# PYCACHE, never into the image or the workspace (an empty value overrides the image's
# PYTHONDONTWRITEBYTECODE=1).
BYTECODE_ENV = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": PYCACHE}
SCRATCH_DIRS = ("home", "hf", "tmp", "data")
USER_DIRS = ("home", "tmp", "data", "reports")  # what a run writes to: the user's under --user
GPU_SHM = "16g"
CPU_SHM = "2g"
# How NCCL leaves the node. No fabric: plain TCP sockets, NCCL's IB transport off. EFA: the
# host's /dev/infiniband and NCCL over Libfabric through the aws-ofi-nccl plugin ("ofi"),
# sockets only on real interfaces (the exclude list keeps loopback and docker bridges out).
FABRICS: dict[str, dict[str, str]] = {
    "none": {"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket"},
    "efa": {
        "NCCL_NET": "Libfabric",
        "NCCL_NET_PLUGIN": "ofi",
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "^lo,docker,veth",
    },
}


@dataclass(frozen=True)
class RunSpec:
    image: str
    argv: Sequence[str]
    gpus: bool = False
    network: str = "none"
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[tuple[Path, str, bool]] = ()  # (host, container, read_only)
    workspace_writable: bool = False
    credentials: bool = False  # .env and ~/.aws, when present and not in CI
    # With credentials: the env file and AWS folder to pass (None: the checkout's .env and
    # ~/.aws; "": none). A relative path is the caller's, "~" is expanded.
    env_file: str | None = None
    aws_dir: str | None = None
    offline: bool = True  # HF_HUB_OFFLINE=1: tiers read only what is cached
    fabric: str = "none"  # a key of FABRICS; only GPU runs talk NCCL
    cuda_devices: str = "all"  # "all" or a comma list of GPU indices
    # The host's process table: a rollout tier's tests may kill the server it started.
    host_pids: bool = False
    # As Enroot and Apptainer run an image: its files read-only, writes only to the mounts
    # (/workspace when writable, scratch) and a /tmp tmpfs.
    read_only: bool = False
    user: str | None = None  # "UID:GID"; default the host's user
    # `halo job start`: detached under this name, kept after it exits (its exit code).
    detach_name: str | None = None
    cap_add: Sequence[str] = ()  # `halo job start --debug`: SYS_PTRACE for py-spy
    # None: the image's own entrypoint; "" clears it (a server image's is serve.sh).
    entrypoint: str | None = None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def _uid(user: str | None) -> str:
    """The uid a run has inside: the one asked for ("UID:GID"), else this host's."""
    return (user or str(os.getuid())).split(":")[0]


def _own_folder(user: str | None) -> str:
    """HOME's and TMPDIR's subfolder for a run as another user: earlier runs as root (CI's, the
    host's user) leave root's caches in the shared ones (~/.cache, TMPDIR/halo), which that
    user could not write to."""
    return f"/{_uid(user)}" if user else ""


def container_env(spec: RunSpec) -> dict[str, str]:
    own = _own_folder(spec.user)
    env = {
        "HOME": f"{SCRATCH}/home{own}",
        "HF_HOME": f"{SCRATCH}/hf",
        "HF_DATASETS_CACHE": f"{SCRATCH}/hf/datasets",
        "TMPDIR": f"{SCRATCH}/tmp{own}",
        "HALO_DATA_ROOT": f"{SCRATCH}/data",
        "HALO_SCRATCH": SCRATCH,
        # The images ship no bytecode: it goes to the container's own /tmp, shared by the
        # processes of one run and gone with it (one image's files only).
        **BYTECODE_ENV,
        # A user the image's /etc/passwd does not know (`--user`, as Enroot and Apptainer run
        # as the caller) has no name: getpass.getuser(), which torch's caches call, then fails.
        # The name carries the uid: per-user folders under the shared scratch (pytest's
        # TMPDIR/pytest-of-USER, owner-checked) must not be another user's from an earlier run.
        "USER": f"halo-{_uid(spec.user)}",
    }
    if spec.offline:
        env["HF_HUB_OFFLINE"] = "1"
    if spec.gpus:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        env.update(FABRICS[spec.fabric])
    return {**env, **spec.env}


def docker_run_args(
    spec: RunSpec, repo: Path, scratch: Path, home: Path | None = None
) -> list[str]:
    """Everything after `docker run`: flags, the image, the command."""
    keep = ["-d", "--name", spec.detach_name] if spec.detach_name else ["--rm"]
    args = [*keep, "--init", "--pull", "never", f"--network={spec.network}", "--ipc=host"]
    args += [f"--cap-add={c}" for c in spec.cap_add]
    args.append(f"--shm-size={GPU_SHM if spec.gpus else CPU_SHM}")
    if spec.host_pids:
        args.append("--pid=host")
    if spec.entrypoint is not None:
        args += ["--entrypoint", spec.entrypoint]
    if spec.gpus:
        if spec.fabric not in FABRICS:
            raise ValueError(f"fabric {spec.fabric!r}: expected one of {sorted(FABRICS)}")
        # NCCL and RDMA pin memory; docker splits --gpus on commas unless the device list is
        # quoted inside the value.
        gpus = "all" if spec.cuda_devices == "all" else f'"device={spec.cuda_devices}"'
        args += ["--gpus", gpus, "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
        if spec.fabric == "efa":
            args += ["--device=/dev/infiniband"]
    args += ["--user", spec.user or f"{os.getuid()}:{os.getgid()}"]
    if spec.read_only:
        args += ["--read-only", "--tmpfs", "/tmp:rw,exec,mode=1777"]
    ro = "" if spec.workspace_writable else ":ro"
    args += ["-v", f"{repo}:{WORKSPACE}{ro}", "-v", f"{scratch}:{SCRATCH}", "-w", WORKSPACE]
    for host, target, read_only in spec.mounts:
        args += ["-v", f"{host}:{target}{':ro' if read_only else ''}"]
    if spec.credentials and not in_ci():
        env_file = _credential_path(spec.env_file, repo / ".env")
        if env_file is not None and env_file.is_file():
            args += ["--env-file", str(env_file)]
        aws = _credential_path(spec.aws_dir, (home or Path.home()) / ".aws")
        if aws is not None and aws.is_dir():
            # $HOME/.aws: the user the run has (the host's) cannot read root's /root/.aws.
            args += ["-v", f"{aws}:{container_env(spec)['HOME']}/.aws:ro"]
    for k, v in sorted(container_env(spec).items()):
        args += ["-e", f"{k}={v}"]
    return [*args, spec.image, *spec.argv]


def _credential_path(given: str | None, default: Path) -> Path | None:
    if given is None:
        return default
    return Path(given).expanduser().absolute() if given else None


def is_gpu_image(ref: str) -> bool:
    """A catalog image built for CUDA architectures (by moving or immutable tag)."""
    from halo.images.catalog import load_catalog

    for image in load_catalog(find_repo()).images.values():
        if ref == image.moving_ref or ref.startswith(f"{image.moving_ref}-"):
            return bool(image.cuda_arch)
    return False


def built_image_ref(name: str) -> str:
    """A catalog image's moving tag (a full ref passes through), refusing one not here.

    A reference pinned by digest (a staged image) is pulled when it is not here yet: that
    is how a CI test job runs exactly the digest its build job staged.
    """
    from halo.errors import HaloError
    from halo.images.catalog import load_catalog

    ref = name if (":" in name or "@" in name) else load_catalog(find_repo()).image(name).moving_ref
    docker = Docker.discover()
    if docker.image_id(ref) is None and "@sha256:" in ref:
        docker.pull(ref)
    if docker.image_id(ref) is None:
        hint = f"nox -s build-{name}" if ":" not in name else "halo image build <name>"
        raise HaloError(f"{ref}: image not built here; run `{hint}`")
    return ref


def prepare_scratch(scratch: Path, user: str | None = None) -> None:
    """Scratch's folders; under `--user` (as Enroot and Apptainer run an image, as the caller)
    the ones a run writes to are handed to that user, so that what it writes is its own. The
    Hugging Face cache stays the host's: seeded here, only read in there."""
    for sub in SCRATCH_DIRS:
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    if user is None or os.geteuid() != 0:
        return
    from halo.testing.ownership import parse_user

    uid, gid = parse_user(user)
    # Scratch itself may be a private folder (mktemp -d: 0700); the user must pass through it
    # to reach its own folders and read the cache, and needs nothing more of it.
    scratch.chmod(scratch.stat().st_mode | 0o111)
    for sub in (*USER_DIRS, f"home{_own_folder(user)}", f"tmp{_own_folder(user)}"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        os.chown(scratch / sub, uid, -1 if gid is None else gid)


def command_line(spec: RunSpec) -> str:
    """The full `docker run …` as one shell line (what `make -n train` shows)."""
    docker = Docker.discover()
    return shlex.join([docker.exe, "run", *docker_run_args(spec, find_repo(), scratch_root())])


def run_spec(spec: RunSpec) -> int:
    repo = find_repo()
    scratch = scratch_root()
    prepare_scratch(scratch, spec.user)
    docker = Docker.discover()
    return docker.run(docker_run_args(spec, repo, scratch)).returncode


def run_in_image(
    image_ref: str,
    argv: list[str],
    *,
    mounts: Sequence[tuple[Path, str, bool]] = (),
    env: Mapping[str, str] | None = None,
) -> int:
    return run_spec(RunSpec(image=image_ref, argv=argv, mounts=mounts, env=env or {}))
