"""Run `halo` commands as forks of one process that has imported halo once.

A command's answer to bad input takes a few milliseconds; starting an interpreter and
importing halo for it took ~0.5 s of CPU, and test_bad_input asks ~700 times. Each command
still runs in a process of its own (its own cwd, environment, file descriptors, exit status,
its children's output captured at the descriptor), forked from a single-threaded server that
has nothing else to do, so no test's state reaches another's.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

_SERVER = r"""
import atexit, importlib, json, os, pkgutil, sys, traceback

def warm():
    import halo
    from halo.cli import build_parser
    build_parser()
    for info in pkgutil.walk_packages(halo.__path__, "halo."):
        if info.name.startswith("halo.train") or info.name.endswith("__main__"):
            continue  # the trainer needs torch; __main__ would run a command
        try:
            importlib.import_module(info.name)
        except ImportError:
            pass  # an optional dependency this environment lacks: the command says so

def child(req):
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))  # as at a start
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.argv = ["halo", *req["argv"]]
    from halo.cli import main
    try:
        code = main(req["argv"])
    except SystemExit as exc:  # what the interpreter does with it
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

warm()
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(request)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class HaloForks:
    """One fork server per test process; `run` answers like subprocess.run(capture_output)."""

    def __init__(self, scratch: Path) -> None:
        self._scratch = scratch
        self._server: subprocess.Popen[str] | None = None
        self._count = 0

    def _start(self) -> subprocess.Popen[str]:
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen(
                [sys.executable, "-c", _SERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,  # a stuck command is killed with its server's group
            )
        return self._server

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        server = self._start()
        assert server.stdin is not None and server.stdout is not None
        self._count += 1
        out, err = (self._scratch / f"{self._count}.{n}" for n in ("out", "err"))
        request = {
            "argv": argv,
            "cwd": str(cwd),
            "env": env,
            "stdout": str(out),
            "stderr": str(err),
        }
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise subprocess.TimeoutExpired(["halo", *argv], timeout)
        answer = json.loads(server.stdout.readline())
        stdout, stderr = (p.read_text(encoding="utf-8", errors="replace") for p in (out, err))
        out.unlink()
        err.unlink()
        return subprocess.CompletedProcess(["halo", *argv], answer["rc"], stdout, stderr)

    def close(self) -> None:
        if self._server is not None and self._server.poll() is None:
            os.killpg(self._server.pid, signal.SIGKILL)
            self._server.wait()
        self._server = None
