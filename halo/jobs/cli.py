"""`halo job start|status|logs|stop|restart|clean`: one lifecycle, Docker or Slurm.

Only the standard library, pydantic and yaml: a login node without torch can start, watch and
stop jobs. Exit codes: 0 done; 1 the job failed (status) or did not stop cleanly; 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    job = sub.add_parser("job", help="detached training jobs: start, status, logs, stop, restart")
    js = job.add_subparsers(dest="job_command", metavar="ACTION", required=True)

    p = js.add_parser("start", help="start a job detached (its log under $HALO_SCRATCH/jobs)")
    p.add_argument("config", type=Path, metavar="CONFIG")
    p.add_argument("--method", default="sft", help="the method (default sft)")
    p.add_argument("--backend", choices=("docker", "slurm"), default="docker")
    p.add_argument("--image", default="cpu", help="docker: catalog image or reference")
    p.add_argument("--debug", action="store_true", help="docker: --cap-add=SYS_PTRACE (py-spy)")
    p.add_argument("--venv", help="slurm: a venv with halo and the stack")
    p.add_argument("--container", help="slurm: a pyxis .sqsh / Apptainer .sif image")
    p.add_argument("--name", help="the job's name (default: the config's runtime.job_name)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="after --: config overrides")
    p.set_defaults(func=_start)

    p = js.add_parser("status", help="each job's state, or one job's")
    p.add_argument("name", nargs="?", metavar="JOB")
    p.set_defaults(func=_status)

    p = js.add_parser("logs", help="print a job's log (-f: follow while it runs)")
    p.add_argument("name", metavar="JOB")
    p.add_argument("-f", "--follow", action="store_true")
    p.set_defaults(func=_logs)

    p = js.add_parser("stop", help="graceful: SIGTERM, the grace period, then kill")
    p.add_argument("name", metavar="JOB")
    p.add_argument("--after", type=float, default=0, help=argparse.SUPPRESS)  # the timer's
    p.add_argument("--only", help=argparse.SUPPRESS)  # the timer: only this run of the job
    p.set_defaults(func=_stop)

    p = js.add_parser("restart", help="stop (if running) and start again: it resumes")
    p.add_argument("name", metavar="JOB")
    p.set_defaults(func=_restart)

    p = js.add_parser("clean", help="remove all but the newest N checkpoints (dry run by default)")
    p.add_argument("name", metavar="JOB")
    p.add_argument("--keep", type=int, required=True, metavar="N")
    p.add_argument("--force", action="store_true", help="really remove them")
    p.set_defaults(func=_clean)


def _start(args: argparse.Namespace) -> int:
    from halo.errors import HaloError
    from halo.jobs.record import JobRecord, jobs_root
    from halo.train.config import load

    # REMAINDER also takes the options given after CONFIG: pick ours out of what precedes `--`.
    rest = list(args.rest)
    cut = rest.index("--") if "--" in rest else len(rest)
    late = argparse.ArgumentParser(prog="halo job start")
    for opt in ("--method", "--backend", "--image", "--venv", "--container", "--name"):
        late.add_argument(opt, default=getattr(args, opt[2:]))
    late.add_argument("--debug", action="store_true", default=args.debug)
    opts, unknown = late.parse_known_args(rest[:cut])
    if opts.backend not in ("docker", "slurm"):
        from halo.errors import HaloError

        raise HaloError(f"--backend: expected docker or slurm, got {opts.backend!r}")
    vars(args).update(vars(opts))
    rest = [*unknown, *rest[cut + 1 :]]
    config = args.config.absolute()  # links are the config loader's to follow (one line)
    cfg = load(config, args.method, rest)  # a bad config is one line here, nothing started
    from halo.urls import hide_override

    # The record is read again by restart, so a secret would have to be written into it.
    secret = next((hidden for a in rest if (hidden := hide_override(a)) != a), None)
    if secret is not None:
        raise HaloError(
            f"{secret}: a job record never holds a secret; give it through the environment "
            "instead (.env, which the job's container reads, or the variable the trainer reads)"
        )
    name = args.name or cfg.runtime.job_name
    if (jobs_root() / name / "job.json").exists():
        raise HaloError(f"job {name}: exists; `halo job restart {name}` or pick --name")
    if args.backend == "slurm" and not shutil.which("sbatch"):
        raise HaloError("--backend slurm: sbatch not found on PATH")
    image = None
    if args.backend == "docker":
        from halo.testing.container import built_image_ref

        image = built_image_ref(args.image)
    job = JobRecord(
        name=name,
        backend=args.backend,
        method=args.method,
        config=str(config),
        overrides=rest,
        grace_s=cfg.runtime.slurm.grace_s,
        max_duration_hours=cfg.runtime.max_duration_hours,
        image=image,
        debug=args.debug,
        venv=args.venv,
        container=args.container,
    )
    _run(job)
    print(f"halo job: started {name} ({job.backend} {job.current}); log {job.log}")
    return 0


def _run(job) -> None:  # type: ignore[no-untyped-def]
    from halo.jobs import backends

    backends.start(job)
    job.timer_pid = backends.start_timer(job)
    job.save()


def _status(args: argparse.Namespace) -> int:
    from halo.jobs import backends
    from halo.jobs.record import all_jobs, load
    from halo.report import table

    jobs = [load(args.name)] if args.name else all_jobs()
    rows, worst = [], 0
    for job in jobs:
        st = backends.state(job)
        latest = _checkpoints(job)
        rows.append(
            [job.name, job.backend, st.state, "-" if st.exit_code is None else str(st.exit_code),
             latest[-1].name if latest else "-", st.detail]
        )  # fmt: skip
        worst = max(worst, 1 if st.state == "failed" else 0)
    print(table(["job", "backend", "state", "exit", "latest checkpoint", "where"], rows))
    return worst if args.name else 0


def _logs(args: argparse.Namespace) -> int:
    from halo.jobs import backends
    from halo.jobs.record import load

    job = load(args.name)
    log = Path(job.log)
    pos = 0
    while True:
        if log.exists():
            with log.open("rb") as f:
                f.seek(pos)
                chunk = f.read()
                pos += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        if not args.follow or not backends.state(job).active:
            if args.follow and log.exists() and log.stat().st_size > pos:
                continue  # what it wrote last
            return 0
        time.sleep(0.5)


def _stop(args: argparse.Namespace) -> int:
    from halo.jobs import backends
    from halo.jobs.record import load

    if args.after:
        time.sleep(args.after)
    job = load(args.name)
    if args.only and job.current != args.only:
        return 0  # the timer of a run that is over: a restart has its own
    if job.timer_pid and not args.after:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(job.timer_pid, signal.SIGTERM)  # this stop makes the timer's moot
    before = backends.state(job)
    if not before.active:
        print(f"halo job: {job.name} is not running ({before.state})")
        return 0
    why = "max_duration_hours reached" if args.after else "asked"
    print(f"halo job: stopping {job.name} ({why}): SIGTERM, up to {job.grace_s}s to checkpoint")
    after = backends.stop(job)
    latest = _checkpoints(job)
    reason = _meta(latest[-1]).get("reason") if latest else None
    print(
        f"halo job: {job.name} {after.state} (exit {after.exit_code}); latest checkpoint "
        f"{latest[-1].name if latest else 'none'} ({reason or '-'})"
    )
    return 0 if after.exit_code in (0, None) and after.state != "failed" else 1


def _restart(args: argparse.Namespace) -> int:
    from halo.jobs import backends
    from halo.jobs.record import load

    job = load(args.name)
    if backends.state(job).active:
        _stop(argparse.Namespace(name=job.name, after=0, only=None))
        job = load(args.name)
    backends.forget_previous(job)
    _run(job)
    print(f"halo job: restarted {job.name} ({job.backend} {job.current}); it resumes from the "
          f"latest verified checkpoint; log {job.log}")  # fmt: skip
    return 0


def _meta(path: Path) -> dict:  # type: ignore[type-arg]
    from halo.train.checkpoints import checkpoint

    return checkpoint.read_meta(path) or {}


def _checkpoints(job) -> list[Path]:  # type: ignore[no-untyped-def]
    """Complete checkpoints of the job, oldest first (meta.json only: no torch)."""
    from halo.train.checkpoints import checkpoint
    from halo.train.config import load

    try:
        job_name = load(Path(job.config), None, job.overrides).runtime.job_name
    except Exception:
        return []
    return [f.path for f in checkpoint.complete(job.checkpoints / job_name)]


def _clean(args: argparse.Namespace) -> int:
    from halo.errors import HaloError
    from halo.jobs.record import load

    if args.keep < 1:
        raise HaloError(
            f"--keep: expected at least 1 (the checkpoint a restart resumes from), got {args.keep}"
        )
    job = load(args.name)
    found = _checkpoints(job)
    drop = found[: max(0, len(found) - args.keep)]
    for path in drop:
        if args.force:
            shutil.rmtree(path)
        print(f"{'removed' if args.force else 'would remove'} {path}")
    kept = found[len(drop) :]
    print(f"halo job clean: {job.name}: keeping {', '.join(p.name for p in kept) or 'none'}"
          + ("" if args.force or not drop else "; dry run: add --force to remove"))  # fmt: skip
    return 0
