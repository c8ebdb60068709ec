"""Runs inside a stack's venv (its own interpreter, standard library only) and reports JSON.

``python probe.py SPEC_JSON`` with SPEC ``{"modules": [...], "absent": [...],
"server": "vllm"|"sglang"|null, "argv": [...]}``, in one process (importing vLLM or SGLang
takes a minute on two cores, so it is done once):

- each module imported in turn (the error's last line kept), each ``absent`` module must
  not import; torch's version, CUDA build and NCCL, numpy's version, vLLM's platform;
- ``argv`` handed to the installed server's own argument parser (the real one, built the way
  its CLI builds it).

The result is one JSON line after the marker ``@@halo-probe@@`` (libraries may print).
No GPU is needed or used: torch only reports what it was built with.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
import traceback


def _last_line(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def _loaded_nccl() -> str | None:
    """The version of the libnccl this process loaded (torch's own report is the version it was
    built against), or None when none is loaded."""
    import ctypes
    import os

    try:
        lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD)
        code = ctypes.c_int()
        if lib.ncclGetVersion(ctypes.byref(code)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    major, rest = divmod(code.value, 10000)  # NCCL >= 2.9: MAJOR*10000 + MINOR*100 + PATCH
    return f"{major}.{rest // 100}.{rest % 100}"


def imports(spec: dict) -> dict:
    out: dict = {"modules": {}, "absent": {}}
    for name in spec.get("modules", []):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                importlib.import_module(name)
            out["modules"][name] = None
        except BaseException as exc:
            out["modules"][name] = _last_line(exc)
    for name in spec.get("absent", []):
        try:
            importlib.import_module(name)
            out["absent"][name] = "imports"
        except ImportError:
            out["absent"][name] = None
        except BaseException as exc:
            out["absent"][name] = f"present but fails: {_last_line(exc)}"
    torch = sys.modules.get("torch")
    if torch is not None:
        nccl = None
        with contextlib.suppress(Exception):
            nccl = ".".join(str(p) for p in torch.cuda.nccl.version())
        out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl}
        out["nccl_loaded"] = _loaded_nccl()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        out["numpy"] = numpy.__version__
    if "vllm" in sys.modules:
        with contextlib.suppress(Exception):
            from vllm.platforms import current_platform

            out["vllm_platform"] = type(current_platform).__name__
    return out


def _vllm_platform_for_parsing() -> None:
    # Without a GPU vLLM's platform is "unspecified" and its parser cannot fill the device
    # defaults; vLLM's own CLI switches to the CPU platform then for `vllm bench`. The flags,
    # their types and choices are the same on every platform.
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()


def _vllm(argv: list[str]) -> object:
    # As vllm.entrypoints.cli.main does: the root parser, the serve subcommand, its validate().
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if argv[:2] != ["vllm", "serve"]:
        raise ValueError(f"expected `vllm serve ...`, got {argv[:2]}")
    _vllm_platform_for_parsing()
    root = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand()
    serve.subparser_init(root.add_subparsers(dest="subparser"))
    args = root.parse_args(argv[1:])
    serve.validate(args)
    return args


def _sglang(argv: list[str]) -> object:
    # As `python -m sglang.launch_server` does (sglang.srt.server_args.prepare_server_args).
    import argparse

    from sglang.srt.server_args import ServerArgs

    if argv[:3] != ["python", "-m", "sglang.launch_server"]:
        raise ValueError(f"expected `python -m sglang.launch_server ...`, got {argv[:3]}")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(argv[3:])


def parse(spec: dict) -> dict:
    server, argv = spec["server"], list(spec["argv"])
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parsed = {"vllm": _vllm, "sglang": _sglang}[server](argv)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"ok": False, "error": lines[-1] if lines else "the parser exited"}
    except BaseException as exc:
        return {"ok": False, "error": _last_line(exc)}
    return {"ok": True, "parsed": {k: repr(v) for k, v in sorted(vars(parsed).items())}}


def main() -> int:
    spec = json.loads(sys.argv[1])
    result = imports(spec)
    if spec.get("server"):
        result["server"] = parse(spec)
    sys.stdout.write("\n@@halo-probe@@" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
