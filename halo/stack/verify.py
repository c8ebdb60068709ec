"""`halo stack verify SET`: install a lock as its image does, then prove the stack, no GPU used.

One ``Row`` per check (check, result, detail); a failed row carries one line per failure.
Checks: install (the images' install step: offline, hash-checked, metadata patches, pip
check), kernels (the set's source derivations realised in the store, installed as the
image's layer 2 does; their modules join the imports), pip-check, versions (installed ==
lock), imports, torch (CUDA 13 build), nccl
(torch's == the lock's), numpy (<2 in training sets), absent (FA4 not in hopper), elf (the
linkage audit), patches (strict, with states), server-args (serve.sh against the real
parser), jit-toolchain (where the lock brings nvcc: VENV/cuda is the CUDA torch was built
for and compiles a kernel), cpu-tier (the CPU tier natively in the venv, on request).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from halo.errors import HaloError
from halo.hashing import tree_files
from halo.patching.engine import drift_lines, plan_all, write_plans
from halo.patching.loader import load_patches
from halo.pins.invariants import NCCL, TORCH, Policy
from halo.pins.lockfile import Lock, normalize
from halo.report import human_bytes, say
from halo.stack import kernels as kernels_module
from halo.stack import probe as probe_module
from halo.stack.cuda_home import HOME_DIR
from halo.stack.install_step import clean_env
from halo.stack.linkage import audit
from halo.stack.servers import serve_script, server_argv, unset_variables
from halo.stack.spec import StackSpec
from halo.stack.stage import install_argv, stage
from halo.store.store import Store

OK, FAIL, SKIP = "ok", "FAIL", "skip"
NVCC = "nvidia-cuda-nvcc"  # a lock that brings it brings DeepEP's JIT toolchain
STAMP = ".halo-stack.json"
PROBE_MARK = "@@halo-probe@@"
PROBE_TIMEOUT_S = 900


@dataclass(frozen=True)
class Row:
    check: str
    result: str
    detail: str
    failures: tuple[str, ...] = ()


def _row(check: str, failures: list[str], detail: str) -> Row:
    return Row(check, FAIL if failures else OK, detail, tuple(failures))


@dataclass(frozen=True)
class Inputs:
    """Everything one set's check reads: the spec, the lock, where things come from and go."""

    spec: StackSpec
    lock: Lock
    store: Store
    python: str
    python_version: str
    venv: Path
    patches: Path
    images: Path
    repo: Path
    policy: Policy = field(default_factory=Policy)


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise HaloError(f"{venv}: no lib/python*/site-packages; the install did not finish")
    return found[0]


def _run_env(venv: Path | None = None) -> dict[str, str]:
    """The host's environment without pip/Python settings; with the venv's CUDA_HOME where the
    lock brings nvcc, as the training images set it (DeepEP's JIT compiles with it)."""
    env = clean_env(os.environ)
    env.pop("CUDA_HOME", None)
    if venv is not None and (venv / HOME_DIR).is_dir():
        env["CUDA_HOME"] = str(venv / HOME_DIR)
    return env


# --- install ----------------------------------------------------------------------------------


def _install_digest(inputs: Inputs, staged_install: Path, requirements: str) -> str:
    h = hashlib.sha256()
    h.update(f"{inputs.python_version}\0{requirements}\0".encode())
    for path in tree_files(staged_install):
        h.update(path.relative_to(staged_install).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def install(inputs: Inputs, fresh: bool) -> Row:
    """The images' install step into ``inputs.venv``; a venv with the same inputs is reused."""
    venv = inputs.venv
    stage_dir = venv.with_name(f".{venv.name}.stage")
    log = venv.with_name(f"{venv.name}.install.log")
    shutil.rmtree(stage_dir, ignore_errors=True)
    try:
        wheels, install_dir = stage(stage_dir, inputs.lock, inputs.store, inputs.patches)
        digest = _install_digest(inputs, install_dir, (wheels / "requirements.txt").read_text())
        stamp = venv / STAMP
        if not fresh and stamp.is_file() and json.loads(stamp.read_text()).get("digest") == digest:
            return Row("install", OK, f"reused {venv.name} (same lock, install step, CPython)")
        shutil.rmtree(venv, ignore_errors=True)
        argv = install_argv(inputs.python, str(install_dir), str(venv), str(wheels))
        say(
            f"  {inputs.spec.set}: installing {len(inputs.lock.packages)} packages offline (log: {log})"
        )
        start = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_run_env()
            )
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                if line.startswith("install-step:"):
                    say(f"    {line.rstrip()}")
            rc = proc.wait()
        seconds = time.monotonic() - start
    finally:
        shutil.rmtree(stage_dir, ignore_errors=True)
    if rc != 0:
        tail = [ln for ln in log.read_text().splitlines() if ln.strip()][-3:]
        return Row("install", FAIL, f"install step exited {rc} ({log})", tuple(tail))
    stamp.write_text(json.dumps({"digest": digest, "set": inputs.spec.set}) + "\n")
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file())
    detail = (
        f"{len(inputs.lock.packages)} packages, {human_bytes(size)} in {seconds:.0f}s "
        f"(CPython {inputs.python_version}, --no-index --require-hashes)"
    )
    return Row("install", OK, detail)


# --- checks over the installed venv ------------------------------------------------------------


def pip_check(inputs: Inputs) -> Row:
    proc = subprocess.run(
        [str(inputs.venv / "bin" / "python"), "-m", "pip", "check"],
        capture_output=True,
        text=True,
        env=_run_env(),
        check=False,
    )
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    if proc.returncode == 0:
        return Row("pip-check", OK, lines[-1] if lines else "no broken requirements")
    return Row("pip-check", FAIL, f"{len(lines)} broken requirement(s)", tuple(lines))


def installed(site: Path) -> dict[str, tuple[str, str]]:
    """normalized name -> (name, version) of every distribution in ``site``."""
    from email.parser import HeaderParser

    found = {}
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        headers = HeaderParser().parsestr(meta.read_text(encoding="utf-8", errors="replace"))
        if headers.get("Name") and headers.get("Version"):
            found[normalize(headers["Name"])] = (headers["Name"], headers["Version"])
    return found


def versions(inputs: Inputs, site: Path, kernels: frozenset[str] = frozenset()) -> Row:
    """Installed == locked; the only other distributions are the set's kernels (source pins)."""
    have = installed(site)
    failures = []
    for pkg in inputs.lock.packages:
        got = have.get(normalize(pkg.name))
        if got is None:
            failures.append(f"{pkg.name}: locked {pkg.version}, not installed")
        elif Version(got[1]) != Version(pkg.version):
            failures.append(f"{pkg.name}: installed {got[1]}, locked {pkg.version}")
    locked = {normalize(p.name) for p in inputs.lock.packages} | kernels
    failures += [
        f"{n}: installed {v}, not in the lock"
        for k, (n, v) in sorted(have.items())
        if k not in locked
    ]
    return _row("versions", failures, f"{len(have)} distributions, each at its locked version")


def run_probe(inputs: Inputs, workdir: Path, extra: tuple[str, ...] = ()) -> dict:
    spec = inputs.spec
    modules = [*spec.modules, *(m for m in extra if m not in spec.modules)]
    request: dict[str, object] = {"modules": modules, "absent": list(spec.absent)}
    if spec.server:
        request["server"] = spec.server
        request["argv"] = server_argv(serve_script(inputs.images, spec.server), spec.server)
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"  {spec.set}: importing {', '.join(modules)} (no GPU; a minute for a server)")
    try:
        proc = subprocess.run(
            [str(inputs.venv / "bin" / "python"), "-I", probe_module.__file__, json.dumps(request)],
            capture_output=True,
            text=True,
            cwd=workdir,  # nothing of the checkout on sys.path
            env=_run_env(inputs.venv),
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"the probe ran past {PROBE_TIMEOUT_S}s"}
    for line in proc.stdout.splitlines():
        if line.startswith(PROBE_MARK):
            return json.loads(line[len(PROBE_MARK) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"the probe exited {proc.returncode}: {tail[0]}"}


def _lock_version(lock: Lock, name: str) -> str | None:
    pkg = lock.package(name)
    return pkg.version if pkg else None


def probe_rows(inputs: Inputs, result: dict, site: Path) -> list[Row]:
    spec, lock = inputs.spec, inputs.lock
    if "error" in result:
        return [Row("imports", FAIL, "the probe did not report", (result["error"],))]
    modules = result.get("modules", {})
    rows = [
        _row(
            "imports",
            [f"import {m}: {err}" for m, err in modules.items() if err],
            ", ".join(modules),
        )
    ]
    torch = result.get("torch")
    if spec.cuda13:
        failures = []
        if torch is None:
            failures.append("torch did not import")
        else:
            want = _lock_version(lock, TORCH)
            if want is None or Version(torch["version"].split("+")[0]) != Version(want):
                failures.append(f"torch {torch['version']} imported, the lock has {want}")
            if not str(torch.get("cuda") or "").startswith("13"):
                failures.append(f"torch.version.cuda is {torch.get('cuda')}, expected 13.x")
        detail = (
            f"torch {torch['version']}, CUDA {torch['cuda']} build (no GPU used)" if torch else "-"
        )
        rows.append(_row("torch", failures, detail))
        want = _lock_version(lock, NCCL)
        built = torch.get("nccl") if torch else None
        loaded = result.get("nccl_loaded")
        got = loaded or built
        failures = []
        if want is None:
            failures.append(f"the lock has no {NCCL}")
        elif got != want:
            who = "the loaded NCCL is" if loaded else "torch reports NCCL"
            failures.append(f"{who} {got}, the lock has {NCCL} {want}")
        # torch reports the NCCL it was built against; where the lock overrides it (DeepEP
        # needs a newer one), the library it loads is the lock's.
        built_note = f" (torch built against {built})" if loaded and built != loaded else ""
        rows.append(_row("nccl", failures, f"torch's NCCL {got} == {NCCL} {want}{built_note}"))
    if spec.numpy_below_2:
        got = result.get("numpy")
        bad = got is None or Version(got) >= Version("2")
        rows.append(
            _row(
                "numpy",
                [f"numpy {got} in a training set (want <2)"] if bad else [],
                f"numpy {got} < 2",
            )
        )
    if spec.absent:
        failures = [f"{m} {why}" for m, why in result.get("absent", {}).items() if why]
        have = installed(site)
        for package, homes in sorted(inputs.policy.only_in.items()):
            if (
                normalize(package) in have
                and spec.set not in homes
                and (package, spec.set) not in inputs.policy.exempt
            ):
                failures.append(
                    f"{package} is installed; allowed only in {', '.join(sorted(homes))}"
                )
        rows.append(_row("absent", failures, f"{', '.join(spec.absent)} absent"))
    if spec.platform:
        got = result.get("vllm_platform")
        failures = (
            [] if got == spec.platform else [f"vLLM selected {got}, expected {spec.platform}"]
        )
        rows.append(_row("platform", failures, f"vLLM platform {got}"))
    if spec.server:
        parsed = result.get("server") or {"ok": False, "error": "no parser result"}
        unset = unset_variables(serve_script(inputs.images, spec.server), spec.server)
        failures = [] if parsed.get("ok") else [f"{spec.server} parser: {parsed.get('error')}"]
        failures += [f"serve.sh reads {v}, which the check does not set" for v in unset]
        detail = (
            f"images/{spec.server}/serve.sh --print-command accepted by {spec.server}'s own parser"
        )
        rows.append(_row("server-args", failures, detail))
    return rows


def install_kernels(inputs: Inputs) -> tuple[Row, list[kernels_module.Kernel]]:
    """The set's realised source derivations, installed as the image's kernels layer does."""
    work = inputs.venv.with_name(f".{inputs.venv.name}.kernels")
    found = kernels_module.set_kernels(inputs.repo, inputs.spec.set, inputs.store, work)
    failures = kernels_module.install(inputs.venv, found, _run_env(inputs.venv))
    row = _row("kernels", failures, kernels_module.kernel_detail(found))
    if not failures and any(k.wheel is None for k in found):
        row = Row("kernels", SKIP, row.detail)
    return row, found


def jit_toolchain(inputs: Inputs, torch: dict | None) -> Row:
    failures, detail = kernels_module.cuda_home(
        inputs.venv, (torch or {}).get("cuda"), _run_env(inputs.venv)
    )
    return _row("jit-toolchain", failures, detail)


def elf(inputs: Inputs, site: Path) -> Row:
    say(f"  {inputs.spec.set}: reading the dynamic section of every ELF object")
    found = audit(inputs.venv, site)
    optional = sorted(found.optional)
    detail = (
        f"{found.objects} objects with DT_NEEDED: {found.by_path} resolved by path, {found.by_soname} by "
        f"SONAME in the venv; driver: {', '.join(sorted(found.driver)) or 'none'}; "
        f"optional host libs of {', '.join(optional) or 'none'}"
    )
    if found.never_loaded:
        skipped = ", ".join(f"{len(v)} of {k}" for k, v in sorted(found.never_loaded.items()))
        detail += f"; CUDA 12 objects never loaded: {skipped}"
    return _row("elf", [f.line(inputs.venv) for f in found.findings], detail)


def patches(inputs: Inputs, site: Path) -> Row:
    """Every patch, strictly, as the image's last layer applies them."""
    plans = plan_all(load_patches(inputs.patches), site)
    results = [p.result for p in plans]
    if drift := drift_lines(results):
        return Row("patches", FAIL, "drift: nothing written", tuple(drift))
    write_plans(plans)
    shown = [f"{r.name} {r.state}" for r in results if r.state != "not-installed"]
    rest = sum(1 for r in results if r.state == "not-installed")
    return Row("patches", OK, "; ".join(shown + ([f"{rest} not installed"] if rest else [])))


def cpu_tier(inputs: Inputs, scratch: Path, torch: dict | None) -> Row:
    """`halo test cpu --native` with the venv's interpreter, from the checkout."""
    from halo.testing.tiers import read_junit

    scratch.mkdir(parents=True, exist_ok=True)
    env = {**_run_env(), "HALO_SCRATCH": str(scratch)}
    say(f"  {inputs.spec.set}: the CPU tier natively on this stack")
    rc = subprocess.run(
        [str(inputs.venv / "bin" / "python"), "-m", "halo", "test", "cpu", "--native"],
        cwd=inputs.repo,
        env=env,
        check=False,
    ).returncode
    counts = read_junit(scratch / "reports" / "cpu.xml")
    which = (
        f"torch {torch['version']} (CUDA {torch['cuda']} build) on the CPU" if torch else "torch ?"
    )
    if counts is None:
        return Row("cpu-tier", FAIL, which, (f"halo test cpu --native exited {rc}, no report",))
    detail = f"{which}: {counts.passed} passed, {counts.skipped} skipped in {counts.seconds:.0f}s"
    failures = (
        [f"{counts.failures} failed, {counts.errors} errors (exit {rc})"]
        if rc or counts.failures or counts.errors
        else []
    )
    return _row("cpu-tier", failures, detail)


def verify(
    inputs: Inputs, fresh: bool, cpu_tier_scratch: Path | None, progress: Callable[[Row], None]
) -> list[Row]:
    rows: list[Row] = []

    def add(row: Row) -> None:
        rows.append(row)
        progress(row)

    add(install(inputs, fresh))
    if not (inputs.venv / "bin" / "python").exists():
        return rows
    site = site_packages(inputs.venv)
    kernel_row, kernels = install_kernels(inputs)
    if kernels:  # a set whose images build source pins
        add(kernel_row)
    add(pip_check(inputs))
    add(versions(inputs, site, frozenset(normalize(k.distribution) for k in kernels if k.wheel)))
    add(patches(inputs, site))
    modules = tuple(m for k in kernels for m in k.modules)
    result = run_probe(inputs, inputs.venv.with_name(f".{inputs.venv.name}.probe"), modules)
    for row in probe_rows(inputs, result, site):
        add(row)
    if inputs.lock.package(NVCC) is not None:
        add(jit_toolchain(inputs, result.get("torch")))
    add(elf(inputs, site))
    if cpu_tier_scratch is not None:
        add(cpu_tier(inputs, cpu_tier_scratch, result.get("torch")))
    return rows
