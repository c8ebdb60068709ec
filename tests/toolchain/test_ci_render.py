"""`halo ci render`: ci/matrix.yaml to the committed workflow, deterministic, failing closed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from support import REPO, halo, tree_listing

from halo.ci.matrix import parse_matrix
from halo.ci.render import render
from halo.ci.sessions import dev_pin, halo_commands, nox_sessions
from halo.errors import HaloError

WORKFLOW = Path(".github/workflows/ci.yml")


def _runs(job: dict) -> list[str]:  # type: ignore[type-arg]
    return [s["run"] for s in job["steps"] if "run" in s]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def sessions() -> frozenset[str]:
    return nox_sessions(REPO / "noxfile.py")


def _render(text: str, sessions: frozenset[str]) -> str:
    matrix = parse_matrix(text, Path("ci/matrix.yaml"), sessions, halo_commands())
    return render(matrix, dev_pin(REPO / "pyproject.toml", "nox"))


def test_sessions_come_from_the_noxfile(sessions: frozenset[str]) -> None:
    # Both plain and loop-made sessions, not only nox's default selection.
    assert {"lint", "ci-render", "build-cpu", "build-blackwell", "test-gpu-core"} <= sessions
    assert "no-such-session" not in sessions


def test_committed_workflow_is_the_render_of_the_matrix(sessions: frozenset[str]) -> None:
    text = (REPO / "ci" / "matrix.yaml").read_text()
    first, second = _render(text, sessions), _render(text, sessions)
    assert first == second
    assert (REPO / WORKFLOW).read_text() == first


def test_check_passes_on_the_checkout(repo_copy: Path) -> None:
    before = _digest(repo_copy / WORKFLOW)
    proc = halo("ci", "render", "--check", cwd=repo_copy)
    assert proc.returncode == 0, proc.stderr
    assert _digest(repo_copy / WORKFLOW) == before


def test_rendered_workflow_has_the_jobs_ci_needs() -> None:
    wf = yaml.safe_load((REPO / WORKFLOW).read_text())
    jobs = wf["jobs"]
    assert set(wf["on"]) == {"push", "pull_request", "workflow_dispatch"}

    def runs(job: str) -> list[str]:
        return [r for r in _runs(jobs[job]) if r.startswith("nox ")]

    cpu_runs = [r for j in jobs.values() if j["runs-on"] == ["ubuntu-24.04"] for r in _runs(j)]
    for needed in (
        "nox -s lint",
        "nox -s pins-check",
        "nox -s lock-check -- cpu",
        "nox -s test-toolchain",
        "nox -s build-cpu",
        "nox -s test-cpu",
        "nox -s plan",
        "nox -s bench",
        "nox -s ci-render -- --check",
    ):
        assert needed in cpu_runs
    assert jobs["hopper"]["runs-on"] == ["self-hosted", "gpu", "h100"]
    assert runs("hopper") == ["nox -s build-hopper", "nox -s test-gpu-core -- --image hopper"]
    assert jobs["blackwell"]["runs-on"] == ["self-hosted", "gpu", "b200"]
    assert runs("blackwell") == ["nox -s build-blackwell", "nox -s test-gpu-core"]
    assert jobs["gpu-full"]["if"] == "github.event_name == 'workflow_dispatch'"
    assert "nox -s test-gpu-full" in runs("gpu-full")
    publish = jobs["publish-cpu"]
    assert publish["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert publish["permissions"] == {"contents": "read", "id-token": "write"}
    uses = [s.get("uses", "") for s in publish["steps"]]
    assert any(u.startswith("aws-actions/configure-aws-credentials@") for u in uses)
    assert wf["env"]["HALO_REGISTRY"] == "${{ vars.HALO_REGISTRY }}"
    assert "halo image push cpu" in _runs(publish)
    # No job without credentials may ask for an OIDC token.
    for job in jobs.values():
        if "permissions" in job:
            assert any("configure-aws-credentials" in s.get("uses", "") for s in job["steps"])


def test_workflow_names_no_registry_host_or_machine_path() -> None:
    text = (REPO / WORKFLOW).read_text() + (REPO / "ci" / "matrix.yaml").read_text()
    for banned in ("amazonaws.com", "public.ecr.aws", "pythonhosted", "/opt/wheels", "/root"):
        assert banned not in text


def test_check_fails_with_a_diff_when_the_workflow_drifts(repo_copy: Path) -> None:
    wf = repo_copy / WORKFLOW
    wf.write_text(wf.read_text().replace("timeout-minutes: 15", "timeout-minutes: 16"))
    drifted = _digest(wf)
    proc = halo("ci", "render", "--check", cwd=repo_copy)
    assert proc.returncode == 1
    assert "-    timeout-minutes: 16" in proc.stdout
    assert "+    timeout-minutes: 15" in proc.stdout
    assert "differs from ci/matrix.yaml" in proc.stderr
    assert _digest(wf) == drifted, "--check writes nothing"
    # Rendering repairs it.
    fixed = halo("ci", "render", cwd=repo_copy)
    assert fixed.returncode == 0, fixed.stderr
    assert wf.read_text() == (REPO / WORKFLOW).read_text()


def test_check_fails_when_the_workflow_is_missing(repo_copy: Path) -> None:
    (repo_copy / WORKFLOW).unlink()
    proc = halo("ci", "render", "--check", cwd=repo_copy)
    assert proc.returncode == 1
    assert not (repo_copy / WORKFLOW).exists()


def _break(repo: Path, old: str, new: str) -> None:
    matrix = repo / "ci" / "matrix.yaml"
    text = matrix.read_text()
    assert old in text
    matrix.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "steps: [lint, ci-render --check]",
            "steps: [lnt, ci-render --check]",
            "ci/matrix.yaml: jobs.lint.steps[0]: unknown nox session 'lnt' (noxfile.py has: ",
        ),
        (
            "    timeout: 15\n",
            "    timeout: 15\n    colour: red\n",
            "ci/matrix.yaml: jobs.lint.colour: unknown key",
        ),
        (
            "runner: hopper",
            "runner: h200",
            "ci/matrix.yaml: jobs.hopper.runner: unknown runner 'h200' (known: blackwell, cpu, hopper)",
        ),
        (
            "needs: [hopper]",
            "needs: [hoper]",
            "ci/matrix.yaml: jobs.publish-hopper.needs: 'hoper' is not a job listed before it",
        ),
        (
            "{halo: image push cpu}",
            "{halo: imag push cpu}",
            "ci/matrix.yaml: jobs.publish-cpu.steps[1].halo: unknown halo command 'imag'",
        ),
        (
            "    when: manual\n",
            "    when: sometimes\n",
            "jobs.gpu-full.when: Input should be 'always', 'main' or 'manual'",
        ),
        ("jobs:\n  lint:\n", "jobs:\n  lint: [unclosed\n", "ci/matrix.yaml: line "),
    ],
)
def test_bad_matrix_is_one_line_exit_2_and_writes_nothing(
    repo_copy: Path, old: str, new: str, message: str
) -> None:
    _break(repo_copy, old, new)
    github = repo_copy / ".github"
    before = {p: _digest(github / p) for p in tree_listing(github) if p.endswith(".yml")}
    for argv in (("ci", "render"), ("ci", "render", "--check")):
        proc = halo(*argv, cwd=repo_copy)
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"halo: error: {repo_copy}/"), lines[0]
        assert message in lines[0]
        assert proc.stdout == ""
    after = {p: _digest(github / p) for p in tree_listing(github) if p.endswith(".yml")}
    assert after == before and before


def test_malformed_yaml_names_the_line() -> None:
    with pytest.raises(HaloError, match=r"^ci/matrix\.yaml: line 2: malformed YAML: found "):
        parse_matrix("name: CI\n\tjobs: {}\n", Path("ci/matrix.yaml"), {"lint"}, {"image"})


def test_nox_pin_comes_from_the_dev_group(tmp_path: Path) -> None:
    assert dev_pin(REPO / "pyproject.toml", "nox") in (REPO / WORKFLOW).read_text()
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[dependency-groups]\ndev = ["nox>=2024"]\n')
    with pytest.raises(HaloError, match=r"dependency-groups\.dev: expected a `nox==VERSION` pin"):
        dev_pin(bad, "nox")
