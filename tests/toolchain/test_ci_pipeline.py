"""CI's own runner: the pipeline table, the schedule it makes, the measurements and the verdict.

The scheduling runs real processes (tiny shell scripts that record when they ran), so "side
by side", "after" and "alone" are seen in their timestamps, not assumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import pytest
from support import REPO, halo

from halo.errors import HaloError
from halo.junit import read_cases, read_counts
from halo.workflow import cireport
from halo.workflow.machine import CpuTimes, Sample, busy_share, mem_used, window
from halo.workflow.pipeline import (
    DiskLedger,
    Pipeline,
    Session,
    check_plan,
    critical_path,
    load_pipeline,
    parse_pipeline,
    plan,
    waits_for,
)
from halo.workflow.runner import nox_launch, run_pipeline, session_env
from halo.workflow.sessions import nox_sessions

P = Path("ci/pipeline.toml")
HEAD = "limit_minutes = 60\ntarget_minutes = 35\n"


def test_the_committed_pipeline_names_only_real_sessions_and_fits_its_target() -> None:
    pipeline = load_pipeline(REPO / P, nox_sessions(REPO / "noxfile.py"), P)
    names = {s.name for s in pipeline.sessions}
    assert {"setup", "build-cpu", "test-toolchain", "image-check", "test-slurm", "bench"} <= names
    assert pipeline.session("test-toolchain").budget <= 15  # the bound
    # Every CI session once: nothing in the table runs a tier or a build twice.
    assert len([s for s in pipeline.sessions if s.name == "test-toolchain"]) == 1
    # Its budgets compose: each session at its whole budget on CI's two cores, within the limit.
    slots = check_plan(pipeline, 3.0)
    assert max(x.end for x in slots) <= pipeline.limit_minutes


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("sessions = [", "ci/pipeline.toml: not valid TOML"),
        (HEAD, "ci/pipeline.toml: sessions: expected a list"),
        (HEAD + 'sessions = [{ name = "a" }]', "sessions[a].budget: expected a positive number"),
        (HEAD + 'sessions = [{ name = "a", budget = -1 }]', "expected a positive number"),
        (HEAD + 'sessions = [{ name = "a", budget = 1, afer = [] }]', "unknown key 'afer'"),
        (HEAD + 'sessions = [{ name = "a", budget = 1, after = ["b"] }]', "after: no session 'b'"),
        (
            HEAD + 'sessions = [{ name = "a", budget = 1 }, { name = "a", budget = 2 }]',
            "session 'a' appears twice",
        ),
        (
            HEAD
            + 'sessions = [{ name = "a", budget = 1, after = ["b"] },'
            + ' { name = "b", budget = 1, after = ["a"] }]',
            "sessions wait for each other: a -> b -> a",
        ),
        (
            "limit_minutes = 30\ntarget_minutes = 35\nsessions = [{ name = 'a', budget = 1 }]",
            "target_minutes 35 is over limit_minutes 30",
        ),
        (HEAD + 'sessions = [{ name = "zz", budget = 1 }]', "sessions[zz]: the noxfile has no"),
        (HEAD + 'sessions = [{ name = "a", budget = 1, cpus = 0 }]', "a positive number of cores"),
        (
            HEAD + 'sessions = [{ name = "a", budget = 1, disk_gb = -1 }]',
            "sessions[a].disk_gb: expected a non-negative number of GB",
        ),
        (HEAD + 'cpus = "many"\nsessions = [{ name = "a", budget = 1 }]', "cpus: expected a"),
        (
            HEAD + 'sessions = [{ name = "a", budget = 1, nice = 20 }]',
            "sessions[a].nice: expected an integer from -20 to 19, got 20",
        ),
        (HEAD + 'sessions = [{ name = "a", budget = 1, nice = 1.5 }]', "an integer from -20"),
    ],
)
def test_a_broken_table_is_one_line(text: str, line: str) -> None:
    with pytest.raises(HaloError) as err:
        parse_pipeline(text, P, frozenset({"a", "b"}))
    assert line in err.value.message
    assert "\n" not in err.value.message


def _slots(pipeline: Pipeline, cpus: float = 3.0) -> dict[str, tuple[float, float]]:
    return {x.session.name: (x.start, x.end) for x in plan(pipeline, cpus)}


def test_the_budgets_plan_the_run_as_the_runner_would_start_it() -> None:
    pipeline = _pipeline(
        Session("setup", 1, external=True),
        Session("build", 2),
        Session("images", 10),
        Session("tests", 5, after=("build",), cpus=1.5),
        Session("slurm", 3, after=("build",), cpus=0.5),
        Session("kernels", 6, after=("build",)),
        Session("s3", 1, after=("slurm",), cpus=0.5),
        Session("bench", 1, alone=True),
    )
    assert _slots(pipeline) == {
        "setup": (0, 1),  # before every session
        "build": (1, 3),
        "images": (1, 11),
        "tests": (3, 8),  # after build, beside images: 2.5 of 3 cores
        "slurm": (3, 6),  # the last half core
        "s3": (6, 7),  # its half core, as slurm ended
        "kernels": (8, 14),  # the first whole core free: tests' end
        "bench": (14, 15),  # alone: after everything else
    }
    path = critical_path(plan(pipeline, 3.0))
    assert [x.session.name for x in path] == ["setup", "build", "tests", "kernels", "bench"]
    # On more cores kernels starts with tests and images' ten minutes become the path.
    assert _slots(pipeline, 4.0)["kernels"] == (3, 9)
    assert [x.session.name for x in critical_path(plan(pipeline, 4.0))] == [
        "setup", "images", "bench"
    ]  # fmt: skip


def test_budgets_that_plan_a_run_past_the_limit_are_one_line() -> None:
    pipeline = replace(
        _pipeline(Session("build", 20), Session("tests", 30, after=("build",))),
        limit_minutes=45,
    )
    with pytest.raises(HaloError) as err:
        check_plan(pipeline, 3.0)
    assert err.value.message == (
        "ci/pipeline.toml: the budgets plan a run of 50 minutes, over limit_minutes 45 "
        "(build -> tests)"
    )
    assert max(x.end for x in check_plan(replace(pipeline, limit_minutes=50), 3.0)) == 50


def test_a_broken_table_is_one_line_and_exit_2_from_the_cli(repo_copy: Path) -> None:
    (repo_copy / "ci" / "pipeline.toml").write_text(HEAD + 'sessions = [{ name = "lint" }]\n')
    proc = halo("workflow", "run", "--dry-run", cwd=repo_copy)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "halo: error: ci/pipeline.toml: sessions[lint].budget: expected a positive number of "
        "minutes, got None"
    ]


def test_the_dry_run_shows_the_planned_run_and_refuses_one_past_the_limit(
    repo_copy: Path,
) -> None:
    proc = halo("workflow", "run", "--dry-run", cwd=repo_copy)
    assert proc.returncode == 0, proc.stderr
    assert "planned" in proc.stdout.splitlines()[1]
    assert "each session at its whole budget, the run takes" in proc.stdout
    assert "waiting on setup -> " in proc.stdout
    table = repo_copy / "ci" / "pipeline.toml"
    table.write_text(
        table.read_text()
        .replace("limit_minutes = 60", "limit_minutes = 25")
        .replace("target_minutes = 35", "target_minutes = 20")
    )
    proc = halo("workflow", "run", "--dry-run", cwd=repo_copy)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("halo: error: ci/pipeline.toml: the budgets plan a run of ")
    assert "over limit_minutes 25 (setup -> " in line


class Recorder:
    """A Launch that runs `sleep S; exit RC` and records each session's start and end."""

    def __init__(self, tmp: Path, plan: Mapping[str, tuple[float, int]]) -> None:
        self.tmp, self.plan = tmp, plan
        self.envs: dict[str, Mapping[str, str]] = {}

    def __call__(self, s: Session, env: Mapping[str, str], log: TextIO) -> subprocess.Popen[bytes]:
        self.envs[s.name] = env
        secs, rc = self.plan[s.name]
        stamp = self.tmp / f"{s.name}.times"
        script = f"date +%s.%N > {stamp}; echo hello from {s.name}; sleep {secs}; date +%s.%N >> {stamp}; exit {rc}"
        return subprocess.Popen(["sh", "-c", script], stdout=log, stderr=subprocess.STDOUT)

    def times(self, name: str) -> tuple[float, float]:
        a, b = self.tmp.joinpath(f"{name}.times").read_text().split()
        return float(a), float(b)


def _pipeline(*sessions: Session) -> Pipeline:
    return Pipeline(tuple(sessions), 60, 35, 1.5)


def test_sessions_run_side_by_side_after_what_they_wait_for_and_alone_last(tmp_path: Path) -> None:
    pipeline = _pipeline(
        Session("build", 1),
        Session("lint", 1),
        Session("tests", 1, after=("build",)),
        Session("slurm", 1, after=("build",)),
        Session("bench", 1, alone=True),
    )
    rec = Recorder(
        tmp_path,
        {
            "build": (0.4, 0),
            "lint": (0.6, 0),
            "tests": (0.6, 0),
            "slurm": (0.3, 0),
            "bench": (0.2, 0),
        },
    )
    lines: list[str] = []
    out = run_pipeline(pipeline, tmp_path / "report", rec, lines.append, base_env={}, poll_s=0.05)
    assert [o.state for o in out] == ["passed"] * 5
    build, lint, tests, slurm, bench = (
        rec.times(n) for n in ("build", "lint", "tests", "slurm", "bench")
    )
    assert lint[0] < build[1] and build[0] < lint[1], "independent sessions overlap"
    assert tests[0] >= build[1] and slurm[0] >= build[1], "after: started only once build ended"
    assert tests[0] < slurm[1] and slurm[0] < tests[1], "both dependents run side by side"
    assert bench[0] >= max(lint[1], tests[1], slurm[1]), "alone: after everything else"
    assert (tmp_path / "report" / "logs" / "tests.log").read_text().strip() == "hello from tests"
    assert any("start tests (beside" in li for li in lines)


def test_a_session_waits_for_cores_and_disk_and_starts_alone_whatever_it_needs() -> None:
    toolchain = Session("toolchain", 1, cpus=2, disk_gb=18)
    images = Session("images", 1, disk_gb=25)
    kernels = Session("kernels", 1, disk_gb=12)
    assert waits_for(kernels, [], 3, 0, 6) is None  # alone: the machine is all there is
    assert waits_for(toolchain, [images], 3, 60, 6) is None
    assert waits_for(kernels, [toolchain, images], 3, 60, 6) == "cores: 3 of 3 busy, it needs 1"
    # Room for its cores but not its disk: without a ledger the running ones' disk_gb is held
    # back whole; with one, only what they may still write.
    assert waits_for(kernels, [images], 3, 40, 6) == "disk: 9 GB to spare, it may write 12"
    assert waits_for(kernels, [images], 3, 43, 6) is None
    assert waits_for(kernels, [images], 3, 40, 6, held_gb=10) is None
    assert waits_for(kernels, [images], 3, 40, 6, held_gb=23) == (
        "disk: 11 GB to spare, it may write 12"
    )
    assert waits_for(Session("lint", 1, cpus=0.2), [toolchain], 2, 0, 6) == (
        "cores: 2 of 2 busy, it needs 0.2"
    )


def test_the_disk_ledger_holds_back_only_what_the_running_sessions_may_still_write() -> None:
    images, toolchain = Session("images", 1, disk_gb=25), Session("toolchain", 1, disk_gb=18)
    ledger = DiskLedger(60)
    ledger.start(images)
    assert ledger.held_gb == 25
    ledger.observe(45)  # images wrote 15 of its 25
    assert ledger.held_gb == pytest.approx(10)
    ledger.start(toolchain)
    # 13.5 GB written while both ran: shared by what each may still write (10 : 18).
    ledger.observe(31.5)
    assert ledger.held_gb == pytest.approx(28 - 13.5)
    # 8.5 GB freed (images removed): given back by what each has added, so it may write again.
    ledger.observe(40)
    assert ledger.held_gb == pytest.approx(23)
    ledger.observe(0)  # more than they may write: nothing is held, never less
    assert ledger.held_gb == 0
    ledger.observe(100)  # all of it freed: back to their whole disk_gb, never more
    assert ledger.held_gb == pytest.approx(43)
    ledger.end("images")
    assert ledger.held_gb == pytest.approx(18)
    ledger.observe(float("inf"))  # no disk measured: nothing to share
    assert ledger.held_gb == pytest.approx(18)


def test_the_runner_starts_a_session_when_there_is_room_and_says_what_waits(
    tmp_path: Path,
) -> None:
    pipeline = _pipeline(
        Session("a", 1), Session("b", 1), Session("c", 1), Session("d", 1, disk_gb=10)
    )
    rec = Recorder(tmp_path, {"a": (0.5, 0), "b": (0.9, 0), "c": (0.3, 0), "d": (0.2, 0)})
    lines: list[str] = []
    free = {"gb": 15.0}  # d (10 GB) fits beside nothing that holds disk, margin 6: 9 to spare
    out = run_pipeline(
        pipeline, tmp_path / "r", rec, lines.append, base_env={}, poll_s=0.05,
        heartbeat_s=0.2, cpus=2, free_gb=lambda: free["gb"],
    )  # fmt: skip
    assert [o.state for o in out] == ["passed"] * 4
    a, b, c, d = (rec.times(n) for n in "abcd")
    assert a[0] < b[1] and b[0] < a[1], "two cores: a and b side by side"
    assert c[0] >= a[1] - 0.01, "c waited for a core"
    assert d[0] >= max(a[1], b[1], c[1]) - 0.01, "d waited until it was alone (its disk)"
    assert any(li.split("] ", 1)[1].startswith("waiting: c (cores: 2 of 2") for li in lines)


def test_the_runner_counts_what_a_running_session_has_written_against_its_disk_gb(
    tmp_path: Path,
) -> None:
    pipeline = _pipeline(
        Session("writer", 1, disk_gb=10),
        Session("gate", 1),
        Session("late", 1, after=("gate",), disk_gb=10),
    )
    rec = Recorder(tmp_path, {"writer": (1.5, 0), "gate": (0.2, 0), "late": (0.1, 0)})
    # The writer writes its whole 10 GB as it starts: 30 GB free, then 20.
    started = tmp_path / "writer.times"
    out = run_pipeline(
        pipeline, tmp_path / "r", rec, [].append, base_env={}, poll_s=0.05, cpus=3,
        free_gb=lambda: 20.0 if started.exists() else 30.0,
    )  # fmt: skip
    assert [o.state for o in out] == ["passed"] * 3
    # 20 free, margin 6, nothing left for the writer to write: 14 to spare. Holding back its
    # whole disk_gb again would leave 4, and late would wait for the writer to end.
    assert rec.times("late")[0] < rec.times("writer")[1] - 0.5


def test_a_failed_session_skips_its_dependents_and_shows_its_log_but_others_go_on(
    tmp_path: Path,
) -> None:
    pipeline = _pipeline(
        Session("build", 1), Session("tests", 1, after=("build",)), Session("lint", 1)
    )
    rec = Recorder(tmp_path, {"build": (0.1, 3), "tests": (0.1, 0), "lint": (0.3, 0)})
    lines: list[str] = []
    out = run_pipeline(pipeline, tmp_path / "r", rec, lines.append, base_env={}, poll_s=0.05)
    assert [(o.session.name, o.state, o.rc) for o in out] == [
        ("build", "failed", 3),
        ("tests", "skipped", None),
        ("lint", "passed", 0),
    ]
    assert out[1].reason == "build did not pass"
    assert not (tmp_path / "tests.times").exists()
    assert "  | hello from build" in lines


def test_each_session_gets_its_report_paths_and_its_own_variables(tmp_path: Path) -> None:
    s = Session("image-check", 1, env=(("DOCKER_HOST", "$ENGINE2"), ("EMPTY", "$NOT_SET_HERE")))
    env = session_env(
        s, tmp_path, {"ENGINE2": "unix:///x.sock", "PYTEST_ADDOPTS": "-x", "VIRTUAL_ENV": "/v"}
    )
    assert env["DOCKER_HOST"] == "unix:///x.sock"
    assert "EMPTY" not in env and "VIRTUAL_ENV" not in env
    assert env["PYTEST_ADDOPTS"] == f"-x --junitxml={tmp_path}/junit/image-check.xml"
    assert env["HALO_TEST_REPORTS"] == f"{tmp_path}/junit/image-check"


STAT = "cpu  {u} 0 {s} {i} {w} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"


def test_cpu_busy_share_reads_proc_stat() -> None:
    a = CpuTimes.parse(STAT.format(u=100, s=50, i=800, w=50))
    b = CpuTimes.parse(STAT.format(u=400, s=150, i=1200, w=50))
    # 400 busy ticks of 800: half of every core's time.
    assert busy_share(a, b) == pytest.approx(0.5)
    assert busy_share(b, b) is None
    with pytest.raises(ValueError):
        CpuTimes.parse("intr 1 2 3\n")
    assert mem_used("MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 400 kB\n") == 600 * 1024
    assert CpuTimes.parse(Path("/proc/stat").read_text()).total > 0


def _sample(at: float, busy: int, total: int, mem: int = 0, disk: int = 0) -> Sample:
    return Sample(at, CpuTimes(busy, total), mem, disk)


def test_a_window_takes_the_samples_around_a_session() -> None:
    samples = [
        _sample(0, 0, 0, 1, 10),
        _sample(5, 10, 100, 7, 30),
        _sample(10, 110, 200, 3, 20),
        _sample(15, 110, 300, 2, 15),
    ]
    w = window(samples, 6, 9)  # from the sample at 5 to the one at 10
    assert w is not None
    assert w.busy == pytest.approx(1.0) and w.peak_mem == 7 and w.peak_disk == 30
    whole = window(samples, 0, 15)
    assert whole is not None and whole.busy == pytest.approx(110 / 300)


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0"
failures="1" skipped="1" tests="4" time="12.5">
<testcase classname="tests.toolchain.test_a" name="test_one" time="7.25" />
<testcase classname="tests.toolchain.test_a.TestK" name="test_two[x]" time="0.5"><failure message="no"/></testcase>
<testcase classname="tests.cpu.test_b" name="test_three" time="3.0"><skipped message="no gpu"/></testcase>
<testcase classname="tests.cpu.test_b" name="test_four" time="1.0" />
</testsuite></testsuites>"""


@pytest.mark.parametrize(
    ("name", "bare"),
    [
        ("test_x@stage-halo-cpu", "test_x"),
        ("test_x[a-b]@grp", "test_x[a-b]"),
        ("test_x[http://u:t@127.0.0.1:9/]", "test_x[http://u:t@127.0.0.1:9/]"),
        ("test_x[http://u:t@127.0.0.1:9/]@grp", "test_x[http://u:t@127.0.0.1:9/]"),
        ("test_plain", "test_plain"),
    ],
)
def test_xdists_group_suffix_is_no_part_of_a_tests_name(name: str, bare: str) -> None:
    from halo.junit import without_group

    assert without_group(name) == bare


def test_junit_reports_give_counts_cases_and_node_ids(tmp_path: Path) -> None:
    path = tmp_path / "r.xml"
    path.write_text(JUNIT)
    counts = read_counts(path)
    assert counts is not None and (counts.passed, counts.failures, counts.skipped) == (2, 1, 1)
    cases = read_cases(path)
    assert [c.nodeid for c in cases] == [
        "tests/toolchain/test_a.py::test_one",
        "tests/toolchain/test_a.py::TestK::test_two[x]",
        "tests/cpu/test_b.py::test_three",
        "tests/cpu/test_b.py::test_four",
    ]
    assert [c.outcome for c in cases] == ["passed", "failed", "skipped", "passed"]
    assert read_counts(tmp_path / "absent.xml") is None


def _summary(tmp_path: Path, minutes_each: float, limit: float = 60) -> cireport.Summary:
    report = tmp_path / "report"
    (report / "junit" / "image-check").mkdir(parents=True, exist_ok=True)
    (report / "junit" / "test-toolchain.xml").write_text(JUNIT)
    (report / "junit" / "image-check" / "cpu.xml").write_text(JUNIT.replace("test_a", "test_c"))
    sessions = (
        Session("setup", 1, external=True),
        Session("test-toolchain", 10, args=("-k", "not x")),
        Session("image-check", 10),
    )
    pipeline = Pipeline(sessions, limit, 35, 1.5)
    t0 = 1000.0
    outcomes = [
        cireport.Outcome(sessions[1], "passed", t0 + 60, t0 + 60 + 60 * minutes_each, 0, Path()),
        cireport.Outcome(sessions[2], "passed", t0 + 60, t0 + 60 + 60 * minutes_each, 0, Path()),
    ]
    end = t0 + 60 + 60 * minutes_each
    samples = [_sample(t0 + 60, 0, 0, 5 << 30, 50 << 30), _sample(end, 50, 100, 9 << 30, 70 << 30)]
    return cireport.summarize(pipeline, outcomes, samples, report, t0, end, 2, (t0 + 60, 0.25))


def test_the_table_counts_every_report_and_lists_the_slowest_tests(tmp_path: Path) -> None:
    summary = _summary(tmp_path, 12)
    text = cireport.render(summary)
    assert summary.minutes == pytest.approx(13)
    setup, toolchain, image = summary.rows
    assert (setup.state, setup.minutes, setup.busy) == ("external", pytest.approx(1), 0.25)
    assert (toolchain.passed, toolchain.failed, toolchain.skipped) == (2, 1, 1)
    assert image.passed == 2  # the tier's report under junit/image-check/
    assert summary.tests == 8 and len(summary.test_ids) == 6  # tests/cpu in both
    assert summary.slowest[0] == cireport.Slow(
        "test-toolchain", "tests/toolchain/test_a.py::test_one", 7.25
    )
    assert "test-toolchain -k not x" in text and "2 passed (1 failed, 1 skipped)" in text
    assert "peak disk 20.0 GiB above the start" in text
    assert "the 8 slowest tests" in text


def test_the_verdict_warns_past_one_and_a_half_budgets_and_fails_past_the_limit(
    tmp_path: Path,
) -> None:
    warnings, failure = cireport.verdict(_summary(tmp_path, 12), 1.5)
    assert warnings == [] and failure is None
    warnings, failure = cireport.verdict(_summary(tmp_path, 16, limit=15), 1.5)
    assert warnings == [
        "warning: test-toolchain took 16.0 min, over 1.5x its budget of 10 min (ci/pipeline.toml)",
        "warning: image-check took 16.0 min, over 1.5x its budget of 10 min (ci/pipeline.toml)",
    ]
    assert failure == (
        "CI took 17.0 min, over its 15-minute limit; sessions over budget (minutes/budget): "
        "test-toolchain 16.0/10, image-check 16.0/10"
    )


def test_a_kept_run_is_compared_with_the_next(tmp_path: Path) -> None:
    first = _summary(tmp_path, 12)
    history = tmp_path / "history"
    history.mkdir()
    (history / "ci-1.json").write_text(cireport.to_json(first))
    (history / "ci-0.json").write_text("{not json")
    again = cireport.from_json(cireport.to_json(first))
    assert again == first
    later = cireport.Summary(**{**json.loads(cireport.to_json(first)), "started": first.started + 1,
                                "rows": first.rows, "slowest": first.slowest,
                                "test_ids": first.test_ids})  # fmt: skip
    last = cireport.latest(history, later.started)
    assert last == first
    assert "last run" in cireport.render(later, last)


def test_a_session_runs_at_its_nice_and_one_without_at_the_runners(tmp_path: Path) -> None:
    """nox_launch starts the real nox; the session's process reports its nice and its group's."""
    noxfile = tmp_path / "noxfile.py"
    noxfile.write_text(
        "import os\nfrom pathlib import Path\nimport nox\n\n"
        "@nox.session(python=False)\n"
        "def probe(session):\n"
        "    group = Path('/proc/self/autogroup')\n"
        "    mine = group.read_text().split()[-1] if group.exists() else '-'\n"
        "    Path(session.posargs[0]).write_text(f'{os.nice(0)} {mine}')\n"
    )
    launch = nox_launch(noxfile)
    seen = {}
    for nice in (0, 5):
        out = tmp_path / f"nice-{nice}"
        s = Session("probe", 1, args=(str(out),), nice=nice)
        with (tmp_path / f"log-{nice}").open("w") as log:
            assert launch(s, dict(os.environ), log).wait(timeout=120) == 0
        seen[nice] = out.read_text().split()
    assert [int(seen[0][0]), int(seen[5][0])] == [os.nice(0), min(os.nice(0) + 5, 19)]
    # Where the kernel groups each session's processes, the session's group has it too: a new
    # session's group starts at 0.
    if Path("/proc/self/autogroup").exists():
        assert [seen[0][1], seen[5][1]] == ["0", "5"]


def test_the_runner_end_to_end_through_nox_with_a_real_session(repo_copy: Path) -> None:
    """`halo workflow run --only checks lint`: real nox sessions, the table, the files."""
    # A checkout, as CI's: ruff reads .gitignore and the device check lists git's files.
    subprocess.run(["git", "init", "-q"], cwd=repo_copy, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo_copy, check=True)
    proc = subprocess.run(
        [sys.executable, "-m", "halo", "workflow", "run", "--only", "checks", "lint",
         "--report", str(repo_copy / "rep")],
        cwd=repo_copy, capture_output=True, text=True, check=False,
        env={**os.environ, "XDG_CACHE_HOME": str(repo_copy / "cache"),
             "HALO_CI_STARTED": str(time.time() - 30)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "start checks" in proc.stderr and "ok   lint" in proc.stderr
    assert "setup" in proc.stdout and "whole run" in proc.stdout
    summary = cireport.from_json((repo_copy / "rep" / "summary.json").read_text())
    assert [r.session for r in summary.rows] == ["setup", "lint", "checks"]
    assert summary.minutes >= 0.5  # the 30 s of "setup" before it count
    assert list((repo_copy / "cache" / "halo" / "ci-runs").glob("ci-*.json"))
