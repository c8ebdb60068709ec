"""Trackers: every metrics.jsonl row also goes to W&B and/or TensorBoard (runtime.report_to).

metrics.jsonl stays the record of truth: a tracker gets exactly the rows written there, at
their step, after they are written. Only the main process tracks. A tracker can never stop
training: one that fails to start or to log (no package, wandb's service socket, a full disk)
is one warning line, and the run goes on without it.

- wandb: offline by default (a run folder under <logs>/<job>/wandb, `wandb sync` uploads it);
  online when WANDB_API_KEY is set and WANDB_MODE does not say otherwise. The run is named
  by the job, its config is the run's config with secrets hidden, and a run resumed from a
  checkpoint continues the same W&B run (its id is kept in <logs>/<job>/wandb-run.json).
  Nothing about the machine or the command line is sent (no metadata, code, git or console).
- tensorboard: a SummaryWriter under <logs>/<job>/tensorboard; a resumed run purges the steps
  after its checkpoint, so a crash's extra steps do not show twice.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from halo.atomic import write_text

Warn = Callable[[str], None]
RUN_ID_FILE = "wandb-run.json"


class Tracker(Protocol):
    name: str

    def log(self, row: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _warn(line: str) -> None:
    print(f"halo: warning: {line}", file=sys.stderr, flush=True)


def _reason(exc: BaseException) -> str:
    """An exception as a short, secret-free phrase for the warning line."""
    from halo.urls import hide_secrets_in_text

    text = " ".join(str(exc).split())[:200]
    return hide_secrets_in_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class Trackers:
    """The run's trackers as one: a tracker that raises is dropped, with one warning line."""

    def __init__(self, trackers: list[Tracker] | None = None, warn: Warn = _warn) -> None:
        self.live = list(trackers or [])
        self.warn = warn

    def log(self, row: dict[str, Any]) -> None:
        if not self.live:
            return
        step = int(row["step"])
        values = {
            k: float(v)
            for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
        }
        for t in list(self.live):
            try:
                t.log(values, step)
            except (Exception, SystemExit) as exc:
                self._drop(t, f"failed to log step {step}", exc)

    def close(self) -> None:
        for t in list(self.live):
            try:
                t.close()
            except (Exception, SystemExit) as exc:
                self._drop(t, "failed to finish", exc)
        self.live = []

    def _drop(self, t: Tracker, what: str, exc: BaseException) -> None:
        self.live.remove(t)
        self.warn(
            f"tracker {t.name} {what} ({_reason(exc)}); training goes on without it, "
            "metrics.jsonl has every value"
        )


class TensorBoard:
    name = "tensorboard"

    def __init__(self, folder: Path, resumed_at: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events at or after it from an earlier (crashed) run are hidden.
        purge = resumed_at + 1 if resumed_at is not None else None
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=purge)
        self.folder = folder

    def log(self, row: dict[str, float], step: int) -> None:
        for key, value in row.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def wandb_mode(env: dict[str, str]) -> str:
    """offline unless a key is set; WANDB_MODE=offline/disabled always wins."""
    mode = env.get("WANDB_MODE", "").strip().lower()
    if mode in ("offline", "disabled", "dryrun"):
        return "offline" if mode == "dryrun" else mode
    return "online" if env.get("WANDB_API_KEY") else "offline"


def wandb_run_id(log_dir: Path, lineage: int, resumed: bool) -> str:
    """The W&B run id of this run: the recorded one when a checkpoint of the same lineage was
    resumed, else a new one (recorded before the run starts)."""
    path = log_dir / RUN_ID_FILE
    if resumed:
        try:
            known = json.loads(path.read_text())
            if known.get("lineage") == lineage and isinstance(known.get("id"), str):
                return str(known["id"])
        except (OSError, ValueError, AttributeError):
            pass
    run_id = secrets.token_hex(4)
    write_text(path, json.dumps({"id": run_id, "lineage": lineage}) + "\n")
    return run_id


class WandB:
    name = "wandb"

    def __init__(
        self, log_dir: Path, job: str, config: dict[str, Any], run_id: str, resumed: bool
    ) -> None:
        import wandb

        self.mode = wandb_mode(dict(os.environ))
        settings = wandb.Settings(
            console="off",
            silent=True,
            init_timeout=60,
            x_save_requirements=False,
            x_disable_meta=True,
            x_disable_machine_info=True,
            disable_git=True,
            save_code=False,
        )
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "halo",
            name=job,
            id=run_id,
            # Offline runs ignore `resume` (the same id is enough: `wandb sync` continues it).
            resume=("allow" if resumed else "never") if self.mode == "online" else None,
            dir=str(log_dir),
            config=config,
            mode=self.mode,  # type: ignore[arg-type]
            settings=settings,
            reinit="create_new",
        )

    def log(self, row: dict[str, float], step: int) -> None:
        self.run.log(row, step=step)

    def close(self) -> None:
        self.run.finish()


def start(
    report_to: list[str],
    log_dir: Path,
    job: str,
    config: dict[str, Any],
    is_main: bool,
    resumed_at: int | None = None,
    lineage: int = 1,
    warn: Warn = _warn,
    say: Callable[[str], None] = print,
) -> Trackers:
    """The trackers ``report_to`` names (on the main process; none elsewhere). ``resumed_at``:
    the step of the checkpoint this run resumed from, None for a fresh run."""
    if not is_main or not report_to:
        return Trackers(warn=warn)
    live: list[Tracker] = []
    for name in report_to:
        try:
            if name == "tensorboard":
                live.append(TensorBoard(log_dir / "tensorboard", resumed_at))
                say(f"tracker tensorboard: {log_dir / 'tensorboard'}")
            elif name == "wandb" and wandb_mode(dict(os.environ)) == "disabled":
                say("tracker wandb: off (WANDB_MODE=disabled)")
            elif name == "wandb":
                resumed = resumed_at is not None
                run_id = wandb_run_id(log_dir, lineage, resumed)
                w = WandB(log_dir, job, config, run_id, resumed)
                live.append(w)
                where = w.run.url if w.mode == "online" else str(Path(w.run.dir).parent)
                say(f"tracker wandb: {w.mode} run {run_id} ({where})")
            else:
                raise ValueError(f"unknown tracker {name!r}")
        except (Exception, SystemExit) as exc:
            warn(
                f"tracker {name} failed to start ({_reason(exc)}); training goes on without "
                "it, metrics.jsonl has every value"
            )
    return Trackers(live, warn)
