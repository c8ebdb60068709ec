"""ci/matrix.yaml: the CI jobs, validated into dataclasses before anything is rendered.

Every step is a nox session with its posargs (``"lock-check cpu"``); nothing else runs on a
runner. Three sessions shape a job:

- ``stage NAME`` builds nothing: it pushes the image just built, by digest, to the staging
  repository; the job then offers ``NAME`` as an output (the pinned ``REPO@sha256:…``).
- ``${staged.NAME}`` in a later job's step is that reference; the job must need the stager.
- ``publish NAME …`` promotes a staged digest to the release tags: such a job runs on main
  only, behind the release environment, and may neither build nor stage.

Session names are checked against the noxfile, so a typo fails here, not on a runner.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from halo.errors import HaloError
from halo.schema import load_yaml, validate

WHEN = ("always", "main", "manual")
# What a hosted runner must be given before the steps (see halo.workflow.hostsetup).
HOST_FEATURES = ("mmdebstrap", "registry", "qemu")
STAGE_SESSION = "stage"
PUBLISH_SESSION = "publish"
STAGED = re.compile(r"^\$\{staged\.([a-z0-9-]+)\}$")

_Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]*$")]
_Text = Annotated[str, StringConstraints(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ActionPin(_Strict):
    """An action pinned by commit; the tag is what a person reads (and what updaters bump)."""

    repo: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+$")]
    commit: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
    tag: _Text

    @property
    def uses(self) -> str:
        return f"{self.repo}@{self.commit}"


class Actions(_Strict):
    checkout: ActionPin
    setup_python: ActionPin = Field(alias="setup-python")
    setup_uv: ActionPin = Field(alias="setup-uv")
    docker_login: ActionPin = Field(alias="docker-login")
    configure_aws_credentials: ActionPin = Field(alias="configure-aws-credentials")
    amazon_ecr_login: ActionPin = Field(alias="amazon-ecr-login")

    def pins(self) -> list[ActionPin]:
        return [getattr(self, f) for f in type(self).model_fields]


class _JobModel(_Strict):
    name: _Text | None = None
    runner: _Name
    steps: Annotated[list[_Text], Field(min_length=1)]
    needs: list[_Name] = []
    when: Literal["always", "main", "manual"] = "always"
    timeout: Annotated[int, Field(gt=0, le=360)] = 60
    host: list[Literal["mmdebstrap", "registry", "qemu"]] = []


class _MatrixModel(_Strict):
    workflow: _Name
    name: _Text
    branches: Annotated[list[_Text], Field(min_length=1)] = ["main"]
    python: Annotated[str, StringConstraints(pattern=r"^3\.\d+$")]
    uv: Annotated[str, StringConstraints(pattern=r"^\d+\.\d+\.\d+$")]
    gpu_label: _Text = Field(alias="gpu-label")
    environment: _Name
    actions: Actions
    runners: Annotated[
        dict[_Name, Annotated[list[_Text], Field(min_length=1)]], Field(min_length=1)
    ]
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]*$")], str] = {}
    jobs: Annotated[dict[_Name, _JobModel], Field(min_length=1)]


@dataclass(frozen=True)
class Staged:
    """``${staged.NAME}``: the digest reference a stage step produced for image NAME."""

    image: str

    @property
    def env(self) -> str:
        return "HALO_STAGED_" + self.image.upper().replace("-", "_")


@dataclass(frozen=True)
class Step:
    session: str
    args: tuple[str | Staged, ...]

    @property
    def staged(self) -> tuple[Staged, ...]:
        return tuple(a for a in self.args if isinstance(a, Staged))

    @property
    def title(self) -> str:
        words = [a if isinstance(a, str) else f"${{staged.{a.image}}}" for a in self.args]
        return " ".join(["nox -s", self.session, *(["--", *words] if words else [])])


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    runner: str
    steps: tuple[Step, ...]
    needs: tuple[str, ...]
    when: str
    timeout: int
    host: tuple[str, ...]

    @property
    def stages(self) -> tuple[str, ...]:
        """The images this job stages (its outputs)."""
        return tuple(str(s.args[0]) for s in self.steps if s.session == STAGE_SESSION and s.args)

    @property
    def pulls(self) -> tuple[Staged, ...]:
        seen: dict[str, Staged] = {}
        for step in self.steps:
            for ref in step.staged:
                seen.setdefault(ref.image, ref)
        return tuple(seen.values())

    @property
    def publishes(self) -> bool:
        return any(s.session == PUBLISH_SESSION for s in self.steps)

    @property
    def attests(self) -> bool:
        """It tests a staged digest (a tier, or the stack check in the image): `halo test`
        attaches the signed result to that digest in the staging registry, which writes."""
        return any(
            s.staged and (s.session.startswith("test-") or s.session == "stack-check")
            for s in self.steps
        )


@dataclass(frozen=True)
class Matrix:
    workflow: str
    name: str
    branches: tuple[str, ...]
    python: str
    uv: str
    gpu_label: str
    environment: str
    actions: Actions
    runners: dict[str, tuple[str, ...]]
    env: dict[str, str]
    jobs: tuple[Job, ...]

    @property
    def output(self) -> Path:
        return Path(".github") / "workflows" / f"{self.workflow}.yml"

    def job(self, job_id: str) -> Job:
        return next(j for j in self.jobs if j.id == job_id)

    def self_hosted(self, job: Job) -> bool:
        return "self-hosted" in self.runners[job.runner]

    def stager(self, image: str) -> Job | None:
        return next((j for j in self.jobs if image in j.stages), None)

    def upstream(self, job: Job) -> set[str]:
        """Every job ``job`` waits for, directly or through others."""
        seen: set[str] = set()
        todo = list(job.needs)
        while todo:
            jid = todo.pop()
            if jid not in seen:
                seen.add(jid)
                todo.extend(self.job(jid).needs)
        return seen


def _step(text: str, where: str, sessions: Collection[str]) -> Step:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise HaloError(f"{where}: cannot split {text!r} into words ({exc})") from None
    if not words:
        raise HaloError(f"{where}: expected a nox session ('NAME [POSARG...]'), got {text!r}")
    if words[0] not in sessions:
        raise HaloError(
            f"{where}: unknown nox session '{words[0]}' (noxfile.py has: {', '.join(sorted(sessions))})"
        )
    args: list[str | Staged] = []
    for word in words[1:]:
        m = STAGED.match(word)
        if m:
            args.append(Staged(m.group(1)))
        elif "${" in word:
            raise HaloError(f"{where}: '{word}': the only placeholder is ${{staged.IMAGE}}")
        else:
            args.append(word)
    if words[0] in (STAGE_SESSION, PUBLISH_SESSION) and (not args or not isinstance(args[0], str)):
        raise HaloError(f"{where}: '{words[0]}' needs the image name as its first argument")
    return Step(words[0], tuple(args))


def _check_job(matrix: Matrix, job: Job, where: str) -> None:
    ids = [j.id for j in matrix.jobs]
    for need in job.needs:
        if need not in ids or ids.index(need) >= ids.index(job.id):
            raise HaloError(f"{where}.needs: '{need}' is not a job listed before it")
    for ref in job.pulls:
        stager = matrix.stager(ref.image)
        if stager is None:
            raise HaloError(f"{where}: ${{staged.{ref.image}}}: no job stages '{ref.image}'")
        if stager.id not in job.needs:
            raise HaloError(
                f"{where}.needs: uses ${{staged.{ref.image}}}, so it must need '{stager.id}'"
            )
    if not job.publishes:
        return
    if job.when != "main":
        raise HaloError(f"{where}.when: a publish job runs on main only, got '{job.when}'")
    for step in job.steps:
        if step.session.startswith("build") or step.session == STAGE_SESSION:
            raise HaloError(
                f"{where}: a publish job promotes what was tested and never builds ('{step.session}')"
            )
    upstream = matrix.upstream(job)
    for step in job.steps:
        if step.session != PUBLISH_SESSION:
            continue
        image = str(step.args[0])
        if not any(r.image == image for r in step.staged):
            raise HaloError(
                f"{where}: 'publish {image}' must name what it promotes: --from ${{staged.{image}}}"
            )
        for other in matrix.jobs:
            tested = any(r.image == image for r in other.pulls) and not other.publishes
            if tested and other.when != "manual" and other.id not in upstream:
                raise HaloError(
                    f"{where}.needs: publishes {image} before '{other.id}' has tested it"
                )


def parse_matrix(text: str, path: Path, sessions: Collection[str]) -> Matrix:
    """Validate ``text``; ``sessions`` are the noxfile's."""
    origin = str(path)
    model = validate(_MatrixModel, load_yaml(text, origin), origin)
    for jid, raw in model.jobs.items():
        if raw.runner not in model.runners:
            raise HaloError(
                f"{origin}: jobs.{jid}.runner: unknown runner '{raw.runner}' "
                f"(known: {', '.join(sorted(model.runners))})"
            )
    jobs = tuple(
        Job(
            id=jid,
            name=raw.name or jid,
            runner=raw.runner,
            steps=tuple(
                _step(s, f"{origin}: jobs.{jid}.steps[{i}]", sessions)
                for i, s in enumerate(raw.steps)
            ),
            needs=tuple(raw.needs),
            when=raw.when,
            timeout=raw.timeout,
            host=tuple(raw.host),
        )
        for jid, raw in model.jobs.items()
    )
    matrix = Matrix(
        workflow=model.workflow,
        name=model.name,
        branches=tuple(model.branches),
        python=model.python,
        uv=model.uv,
        gpu_label=model.gpu_label,
        environment=model.environment,
        actions=model.actions,
        runners={k: tuple(v) for k, v in model.runners.items()},
        env=dict(model.env),
        jobs=jobs,
    )
    for job in jobs:
        _check_job(matrix, job, f"{origin}: jobs.{job.id}")
    staged_twice = [i for j in jobs for i in j.stages if sum(i in k.stages for k in jobs) > 1]
    if staged_twice:
        raise HaloError(f"{origin}: jobs: '{staged_twice[0]}' is staged by more than one job")
    return matrix
