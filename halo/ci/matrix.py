"""ci/matrix.yaml: the CI jobs, validated into dataclasses before anything is rendered.

Every job names a runner (a list of labels) and its steps. A step is a nox session with its
posargs (``"lock-check cpu"``) or, for what has no session, a halo command
(``{halo: "image push cpu"}``). Session names are checked against the noxfile and halo
commands against halo's own parser, so a typo fails here, not on a runner.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import yaml

from halo.errors import HaloError
from halo.yamlfields import Fields

WHEN = ("always", "main", "manual")
CREDENTIALS = ("none", "aws-oidc")
ACTIONS = ("checkout", "setup-python", "configure-aws-credentials", "amazon-ecr-login")


@dataclass(frozen=True)
class Step:
    kind: str  # "nox" or "halo"
    name: str  # the session, or halo's sub-command
    args: tuple[str, ...]

    @property
    def argv(self) -> tuple[str, ...]:
        if self.kind == "halo":
            return ("halo", self.name, *self.args)
        return ("nox", "-s", self.name, *(("--", *self.args) if self.args else ()))


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    runner: str
    steps: tuple[Step, ...]
    needs: tuple[str, ...]
    when: str
    timeout: int
    apt: tuple[str, ...]
    credentials: str


@dataclass(frozen=True)
class Matrix:
    workflow: str
    name: str
    branches: tuple[str, ...]
    python: str
    uv: str
    actions: dict[str, str]
    runners: dict[str, tuple[str, ...]]
    env: dict[str, str]
    jobs: tuple[Job, ...]

    @property
    def output(self) -> Path:
        return Path(".github") / "workflows" / f"{self.workflow}.yml"


def load_yaml(text: str, path: Path) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise HaloError(f"{path}:{line} malformed YAML: {problem}") from None


def _str_map(raw: object, where: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise HaloError(f"{where}: expected a mapping of strings to strings, got {raw!r}")
    return dict(raw)


def _words(text: str, where: str) -> list[str]:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise HaloError(f"{where}: cannot split {text!r} into words ({exc})") from None
    if not words:
        raise HaloError(f"{where}: expected a command, got {text!r}")
    return words


def _step(raw: object, where: str, sessions: Collection[str], commands: Collection[str]) -> Step:
    if isinstance(raw, dict):
        f = Fields(raw, where, {"halo"})
        words = _words(f.str("halo"), f"{where}.halo")
        if words[0] not in commands:
            raise HaloError(
                f"{where}.halo: unknown halo command '{words[0]}' (known: {', '.join(sorted(commands))})"
            )
        return Step("halo", words[0], tuple(words[1:]))
    if not isinstance(raw, str) or not raw.strip():
        raise HaloError(
            f"{where}: expected a nox session ('NAME [POSARG...]') or {{halo: COMMAND}}, got {raw!r}"
        )
    words = _words(raw, where)
    if words[0] not in sessions:
        raise HaloError(
            f"{where}: unknown nox session '{words[0]}' (noxfile.py has: {', '.join(sorted(sessions))})"
        )
    return Step("nox", words[0], tuple(words[1:]))


def _job(
    job_id: str,
    raw: object,
    where: str,
    runners: dict[str, tuple[str, ...]],
    sessions: Collection[str],
    commands: Collection[str],
) -> Job:
    f = Fields(
        raw,
        where,
        {"name", "runner", "steps", "needs", "when", "timeout", "apt", "credentials"},
    )
    runner = f.str("runner")
    if runner not in runners:
        raise HaloError(
            f"{where}.runner: unknown runner '{runner}' (known: {', '.join(sorted(runners))})"
        )
    raw_steps = f.data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise HaloError(f"{where}.steps: expected a non-empty list of steps")
    when = f.str("when", "always")
    if when not in WHEN:
        raise HaloError(f"{where}.when: expected one of {', '.join(WHEN)}, got {when!r}")
    credentials = f.str("credentials", "none")
    if credentials not in CREDENTIALS:
        raise HaloError(
            f"{where}.credentials: expected one of {', '.join(CREDENTIALS)}, got {credentials!r}"
        )
    timeout = f.data.get("timeout", 60)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
        raise HaloError(f"{where}.timeout: expected minutes as a positive integer, got {timeout!r}")
    return Job(
        id=job_id,
        name=f.str("name", job_id),
        runner=runner,
        steps=tuple(
            _step(s, f"{where}.steps[{i}]", sessions, commands) for i, s in enumerate(raw_steps)
        ),
        needs=f.strs("needs"),
        when=when,
        timeout=timeout,
        apt=f.strs("apt"),
        credentials=credentials,
    )


def parse_matrix(
    text: str, path: Path, sessions: Collection[str], commands: Collection[str]
) -> Matrix:
    """Validate ``text``; ``sessions`` are the noxfile's, ``commands`` halo's sub-commands."""
    top = Fields(
        load_yaml(text, path),
        str(path),
        {"workflow", "name", "branches", "python", "uv", "actions", "runners", "env", "jobs"},
    )
    actions = _str_map(top.data.get("actions"), f"{path}: actions")
    missing = [a for a in ACTIONS if a not in actions]
    unknown = sorted(set(actions) - set(ACTIONS))
    if missing or unknown:
        raise HaloError(
            f"{path}: actions: expected exactly {', '.join(ACTIONS)} "
            f"({'missing ' + missing[0] if missing else 'unknown ' + unknown[0]})"
        )
    raw_runners = top.data.get("runners")
    if not isinstance(raw_runners, dict) or not raw_runners:
        raise HaloError(f"{path}: runners: expected a mapping of runner names to label lists")
    runners = {
        name: Fields({"labels": labels}, f"{path}: runners.{name}", {"labels"}).strs("labels")
        for name, labels in raw_runners.items()
    }
    raw_jobs = top.data.get("jobs")
    if not isinstance(raw_jobs, dict) or not raw_jobs:
        raise HaloError(f"{path}: jobs: expected a non-empty mapping of job ids")
    jobs = tuple(
        _job(str(jid), raw, f"{path}: jobs.{jid}", runners, sessions, commands)
        for jid, raw in raw_jobs.items()
    )
    ids = [j.id for j in jobs]
    for job in jobs:
        for need in job.needs:
            if need not in ids or ids.index(need) >= ids.index(job.id):
                raise HaloError(
                    f"{path}: jobs.{job.id}.needs: '{need}' is not a job listed before it"
                )
    return Matrix(
        workflow=top.str("workflow"),
        name=top.str("name"),
        branches=top.strs("branches") or ("main",),
        python=top.str("python"),
        uv=top.str("uv"),
        actions=actions,
        runners=runners,
        env=_str_map(top.data.get("env", {}), f"{path}: env"),
        jobs=jobs,
    )
