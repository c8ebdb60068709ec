"""Build one source tree into one wheel on this host, with no network at all.

The build runs in fresh network and mount namespaces (``unshare --net --mount``): the
network namespace has only a loopback that is down, so a build script that downloads fails
instead of fetching (this is where the Docker builder's ``--network none`` cannot be had: no
base image, or no engine). In the mount namespace the build folder and the builder venv are
bound at fixed paths (``/tmp/halo-drv`` and ``/tmp/halo-drv/venv``), so nothing of this host's
layout reaches the compiled objects (``__FILE__``, include paths) and two hosts with the same
inputs compile the same paths. Root (or a user namespace) is needed; CI and this kind of host
run as root.

The environment is built from nothing: the builder venv and its CUDA_HOME first on PATH,
then the host's compilers; HOME and TMPDIR inside the build folder; no pip configuration, no
proxy variables; SOURCE_DATE_EPOCH fixed. ``git``, ``curl`` and ``wget`` are shadowed by a
guard that records the call and fails, so a build script that reaches for them is named,
not silently tolerated (halo builds from pinned archives; such a script needs a source patch).

Output goes to a log file; progress is the ninja ``[n/m]`` counter, a line every so often.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from halo.errors import HaloError
from halo.report import say
from halo.stack.cuda_home import HOME_DIR

GUARDED = ("git", "curl", "wget")
HOST_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
FIXED = Path("/tmp/halo-drv")  # where the build folder is bound inside the mount namespace
SOURCE_DATE_EPOCH = 1793491200  # 2026-11-01T00:00:00Z, as the made bases
# Inside the namespaces: bind the build folder and the venv at their fixed paths, then run.
_ENTER = (
    f'mount --bind "$1" {FIXED} && mount --bind "$2" {FIXED}/venv && '
    f'cd "{FIXED}/src/$3" && shift 3 && exec "$@"'
)
PROGRESS_EVERY_S = 30.0
STOP_GRACE_S = 15.0
_NINJA = re.compile(r"^\s*\[(\d+)/(\d+)\]")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")  # a traceback's last line
_GUARD = """#!/bin/sh
# halo's native builder: builds run offline from pinned sources; this call is refused.
printf '%s\\n' "$(basename "$0") $*" >> "{log}"
echo "halo builder: refused: $(basename "$0") $* (offline build from a pinned archive)" >&2
exit 127
"""


def namespace_problem() -> str | None:
    """Why no network-less namespace can be made here, or None."""
    try:
        proc = subprocess.run(
            ["unshare", "--net", "--mount", "--", "true"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        return "unshare is not installed (util-linux)"
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return None


def write_guard(folder: Path, log: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in GUARDED:
        shim = folder / name
        shim.write_text(_GUARD.format(log=log))
        shim.chmod(0o755)


def env_for(cuda: bool, extra: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of the build (fixed paths): nothing of the caller's but ``extra``."""
    path = [str(FIXED / "guard"), str(FIXED / "venv" / "bin")]
    if cuda:
        path.append(str(FIXED / "venv" / HOME_DIR / "bin"))
    env = {
        "PATH": os.pathsep.join([*path, *HOST_PATH]),
        "HOME": str(FIXED / "home"),
        "TMPDIR": str(FIXED / "tmp"),
        "LANG": "C.UTF-8",
        "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH),
        "PYTHONHASHSEED": "0",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if cuda:
        env["CUDA_HOME"] = str(FIXED / "venv" / HOME_DIR)
    env.update(extra)
    return env


def build_argv(work: Path, venv: Path, subdirectory: str, verbose: bool = False) -> list[str]:
    """Enter new network and mount namespaces, bind the build's folders, run ``pip wheel``.

    ``verbose`` lets the build's own output (ninja's [n/m], each compiler command) through
    pip as it happens; it changes what is logged, not what is built, so the recipe leaves it out.
    """
    python = str(FIXED / "venv" / "bin" / "python")
    pip = ["-m", "pip", "wheel", "--no-index", "--no-deps", "--no-build-isolation",
           "--no-cache-dir", "-w", str(FIXED / "out"), "."]  # fmt: skip
    if verbose:
        pip.insert(2, "-v")
    return [
        "unshare", "--net", "--mount", "--", "sh", "-euc", _ENTER, "halo-drv",
        str(work), str(venv), subdirectory or ".", python, *pip,
    ]  # fmt: skip


def recipe() -> dict[str, object]:
    """What of this builder decides its output, for the derivation hash: the command, the
    environment and the guard (host folders as placeholders). Logging and progress are not
    in it, so improving them rebuilds nothing."""
    return {
        "argv": build_argv(Path("/WORK"), Path("/VENV"), "SUBDIR"),
        "env": env_for(True, {}),
        "guarded": list(GUARDED),
        "guard": _GUARD,
    }


class Stopped(BaseException):
    """halo was asked to stop (SIGTERM) while a build ran: the build is stopped with it."""


def _stop_on_sigterm() -> object:
    """Make SIGTERM raise in the main thread (Python's default would exit past the cleanup)."""

    def handler(signum: int, frame: object) -> None:
        raise Stopped()

    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, handler)
    return None


def stop_build(proc: subprocess.Popen[str]) -> None:
    """Stop a build's whole session: SIGTERM first, which ninja passes on to every compiler it
    runs (each in its own process group, so a SIGKILL of the group would orphan them)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_logged(
    argv: list[str],
    cwd: Path,
    env: Mapping[str, str],
    log: Path,
    label: str,
    on_line: Callable[[str], None] = lambda line: None,
) -> int:
    """Run ``argv`` with its output in ``log``; a progress line now and then; its exit code.

    If halo is interrupted or terminated meanwhile, the build is stopped before it goes on.
    """
    last, shown = time.monotonic(), ""
    previous = _stop_on_sigterm()
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", start_new_session=True,
            )  # fmt: skip
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    out.write(line)
                    on_line(line)
                    if m := _NINJA.match(line):
                        shown = f"{m.group(1)}/{m.group(2)} compiled"
                    if time.monotonic() - last >= PROGRESS_EVERY_S:
                        last = time.monotonic()
                        say(f"  {label}: {shown or 'configuring'} (log: {log})")
                return proc.wait()
            except BaseException:
                stop_build(proc)
                raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)  # type: ignore[arg-type]


def build_wheel(
    venv: Path, work: Path, subdirectory: str, env: Mapping[str, str], label: str
) -> Path:
    """The wheel of ``pip wheel`` of ``work/src/subdirectory``, network-less, at fixed paths."""
    if problem := namespace_problem():
        raise HaloError(
            f"derivation {label}: cannot make network-less namespaces (unshare --net --mount: "
            f"{problem}); run as root, or build in Docker where a builder base can be had"
        )
    out, log, refused = work / "out", work / "build.log", work / "refused.log"
    write_guard(work / "guard", FIXED / "refused.log")
    for folder in (out, work / "home", work / "tmp", work / "venv"):
        folder.mkdir(parents=True, exist_ok=True)
    FIXED.mkdir(parents=True, exist_ok=True)  # the mount point; it stays empty out here
    full_env = env_for((venv / HOME_DIR).is_dir(), env)
    rc = run_logged(build_argv(work, venv, subdirectory, verbose=True), work, full_env, log, label)
    if refused.is_file() and (calls := refused.read_text().splitlines()):
        raise HaloError(
            f"derivation {label}: its build ran `{calls[0]}` (offline builds from pinned archives "
            "do not; patch the build script in patches/sources/)"
        )
    if rc != 0:
        raise HaloError(f"derivation {label}: pip wheel exited {rc}: {_last_error(log)}")
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise HaloError(
            f"derivation {label}: expected one wheel from the build, got {[w.name for w in wheels]}"
        )
    return wheels[0]


def _last_error(log: Path) -> str:
    """The line that says why: the first fatal compiler error, else the last exception raised
    in the build script, else the last line that mentions an error."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    fatal = next((ln for ln in lines if "fatal error:" in ln), None)
    if fatal is not None:
        return fatal[:300] + _hint(fatal)
    raised = [ln for ln in lines if _EXCEPTION.match(ln)]
    if raised:
        return raised[-1][:300]
    for line in reversed(lines):
        if "error" in line.lower() and not line.startswith("note:"):
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def _hint(fatal: str) -> str:
    from halo.builder.toolchain import HOST_HEADERS

    missing = next((rel for rel in HOST_HEADERS if f"{rel}: No such file" in fatal), None)
    return f" (a host header: install {HOST_HEADERS[missing]})" if missing else ""
