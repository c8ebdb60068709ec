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
from typing import Annotated, Literal

from pydantic import Field

from halo.schema import Problems, Strict, load_yaml, matches

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


class JobSpec(Strict):
    name: Annotated[str, Field(min_length=1)] | None = None
    runner: Annotated[str, Field(min_length=1)]
    steps: Annotated[list[object], Field(min_length=1)]
    needs: list[str] = Field(default_factory=list)
    when: Literal["always", "main", "manual"] = "always"
    timeout: Annotated[int, Field(gt=0)] = 60  # minutes
    apt: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    credentials: Literal["none", "aws-oidc"] = "none"


class MatrixSpec(Strict):
    workflow: Annotated[str, matches(r"[A-Za-z0-9_-]+", "a workflow file name")]
    name: Annotated[str, Field(min_length=1)]
    branches: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=lambda: ["main"])
    python: Annotated[str, Field(min_length=1)]
    uv: Annotated[str, Field(min_length=1)]
    actions: dict[str, Annotated[str, Field(min_length=1)]]
    runners: Annotated[dict[str, list[Annotated[str, Field(min_length=1)]]], Field(min_length=1)]
    env: dict[str, str] = Field(default_factory=dict)
    jobs: Annotated[dict[str, object], Field(min_length=1)]


def _words(text: str, where: str, found: Problems) -> list[str]:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        found.add(where, f"cannot split {text!r} into words ({exc})")
        return []
    if not words:
        found.add(where, f"expected a command, got {text!r}")
    return words


class HaloStep(Strict):
    halo: Annotated[str, Field(min_length=1)]


def _step(
    raw: object, where: str, sessions: Collection[str], commands: Collection[str], found: Problems
) -> Step | None:
    if isinstance(raw, dict):
        spec = found.model(HaloStep, raw, where)
        words = _words(spec.halo, f"{where}.halo", found) if spec else []
        if not words:
            return None
        if words[0] not in commands:
            known = ", ".join(sorted(commands))
            found.add(f"{where}.halo", f"unknown halo command '{words[0]}' (known: {known})")
            return None
        return Step("halo", words[0], tuple(words[1:]))
    if not isinstance(raw, str) or not raw.strip():
        found.add(
            where, f"expected a nox session ('NAME [POSARG...]') or {{halo: COMMAND}}, got {raw!r}"
        )
        return None
    words = _words(raw, where, found)
    if not words:
        return None
    if words[0] not in sessions:
        known = ", ".join(sorted(sessions))
        found.add(where, f"unknown nox session '{words[0]}' (noxfile.py has: {known})")
        return None
    return Step("nox", words[0], tuple(words[1:]))


def _job(
    job_id: str,
    raw: object,
    runners: dict[str, list[str]],
    sessions: Collection[str],
    commands: Collection[str],
    found: Problems,
) -> Job | None:
    where = f"jobs.{job_id}"
    spec = found.model(JobSpec, raw, where)
    if spec is None:
        return None
    if spec.runner not in runners:
        known = ", ".join(sorted(runners))
        found.add(f"{where}.runner", f"unknown runner '{spec.runner}' (known: {known})")
    steps = [
        _step(s, f"{where}.steps[{i}]", sessions, commands, found) for i, s in enumerate(spec.steps)
    ]
    return Job(
        id=job_id,
        name=spec.name or job_id,
        runner=spec.runner,
        steps=tuple(s for s in steps if s is not None),
        needs=tuple(spec.needs),
        when=spec.when,
        timeout=spec.timeout,
        apt=tuple(spec.apt),
        credentials=spec.credentials,
    )


def parse_matrix(
    text: str, path: Path, sessions: Collection[str], commands: Collection[str]
) -> Matrix:
    """Validate ``text``; ``sessions`` are the noxfile's, ``commands`` halo's sub-commands.

    Read through halo.schema: strict YAML (a duplicate key is an error) and every problem of
    the file reported at once, by key path.
    """
    found = Problems(str(path))
    top = found.model(MatrixSpec, load_yaml(text, str(path)))
    if top is None:
        found.check()
    assert top is not None
    missing = [a for a in ACTIONS if a not in top.actions]
    unknown = sorted(set(top.actions) - set(ACTIONS))
    if missing or unknown:
        found.add(
            "actions",
            f"expected exactly {', '.join(ACTIONS)} "
            f"({'missing ' + missing[0] if missing else 'unknown ' + unknown[0]})",
        )
    jobs = [
        _job(str(jid), raw, top.runners, sessions, commands, found) for jid, raw in top.jobs.items()
    ]
    ids = [str(jid) for jid in top.jobs]
    for job in jobs:
        for need in job.needs if job else ():
            if need not in ids or ids.index(need) >= ids.index(job.id):
                found.add(f"jobs.{job.id}.needs", f"'{need}' is not a job listed before it")
    found.check()
    return Matrix(
        workflow=top.workflow,
        name=top.name,
        branches=tuple(top.branches),
        python=top.python,
        uv=top.uv,
        actions=dict(top.actions),
        runners={k: tuple(v) for k, v in top.runners.items()},
        env=dict(top.env),
        jobs=tuple(j for j in jobs if j is not None),
    )
