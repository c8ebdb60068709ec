"""Real BuildKit builds of halo:cpu (needs a Docker engine; skipped with the reason without one).

Builds are the expensive part, so one build serves many assertions: `cpu_built` is the
checkout's halo:cpu (a no-op when CI's build-cpu ran first), the layer test makes two warm
builds in a copy, and the reproducibility test builds from scratch in a second, private engine
(its own data root) with a fresh store: `halo image verify cpu --expect` the checkout's image ID.
That engine and all it holds are removed when it ends; in CI it must run, not skip.
Tests name the immutable tag, never the moving one, which other checkouts move too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dockerd import PrivateEngine
from support import REPO, built_ref, docker_or_skip, halo, linked_store

from halo.images.base import DEFAULT_EPOCH, base_ref
from halo.images.catalog import load_catalog
from halo.images.docker import CONTEXT_RECORD, Docker
from halo.images.reproducible import iso
from halo.paths import store_root
from halo.pins.lockfile import load_lock
from halo.store.store import Store
from halo.testing.container import in_ci

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def docker() -> Docker:
    return docker_or_skip()


@pytest.fixture(scope="module")
def cpu_built(docker: Docker) -> str:
    """halo:cpu from the real checkout (a no-op when CI's build-cpu ran first); its immutable ref."""
    proc = halo("image", "build", "cpu", cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return built_ref(proc.stdout)


@pytest.fixture
def test_repo(repo_copy: Path, docker: Docker) -> Iterator[Path]:
    """A checkout whose images are tagged under a repository of its own (halo-test-XXXXXXXX),
    so halo:cpu is never moved by a test and tests side by side never remove each other's."""
    name = f"halo-test-{uuid.uuid4().hex[:8]}"
    catalog = repo_copy / "images" / "images.yaml"
    catalog.write_text(catalog.read_text().replace("repository: halo\n", f"repository: {name}\n"))
    yield repo_copy
    for ref in docker.refs(name):
        docker.remove(ref)


def _repository(repo: Path) -> str:
    """The repository test_repo gave the copy's cpu image."""
    return load_catalog(repo).image("cpu").repository


def _touch_halo(repo: Path, text: str) -> None:
    init = repo / "halo" / "__init__.py"
    init.write_text(init.read_text() + f"# {text}\n")


def _run(docker: Docker, ref: str, *argv: str) -> str:
    proc = docker.run(["--rm", "--network", "none", "--entrypoint", argv[0], ref, *argv[1:]], True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_second_build_is_a_no_op(cpu_built: str) -> None:
    proc = halo("image", "build", "cpu", cwd=REPO)
    assert proc.returncode == 0
    assert "halo:cpu: up to date (input hash " in proc.stdout
    assert "docker build" not in proc.stderr


def test_a_tag_alone_does_not_make_a_no_op(cpu_built: str, test_repo: Path, docker: Docker) -> None:
    """The input hash is recomputed and must match the image's own label in full."""
    from halo.images.build import up_to_date
    from halo.images.buildplan import resolve_inputs

    _touch_halo(test_repo, "tag test")  # inputs of its own, so cpu_built's label differs
    catalog = load_catalog(test_repo)
    image = catalog.image("cpu")
    inputs = resolve_inputs(test_repo, catalog, image, docker)
    squatter = base_ref(catalog.bases[image.base], test_repo)  # an image without that label
    docker.tag(squatter, image.immutable_ref(inputs.hash))
    assert up_to_date(docker, image, inputs) is None
    docker.tag(cpu_built, image.immutable_ref(inputs.hash))  # labelled, with another hash
    assert up_to_date(docker, image, inputs) is None


def test_a_push_recomputes_the_input_hash_and_refuses_a_stale_image(
    cpu_built: str, test_repo: Path, docker: Docker
) -> None:
    """The moving tag points at an image whose label says another hash: a push that read the
    label would publish it as if it were this checkout's."""
    name = _repository(test_repo)
    docker.tag(cpu_built, f"{name}:cpu")
    _touch_halo(test_repo, "push test")
    proc = halo("image", "push", "cpu", "--registry", "127.0.0.1:9/halo-test", cwd=test_repo)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert re.fullmatch(
        rf"halo: error: {name}:cpu-[0-9a-f]{{12}}: not built here for the checkout's inputs; "
        r"run `halo image build cpu` first",
        line,
    ), line


def test_changing_halo_rebuilds_only_the_last_layer_and_ships_the_change(
    cpu_built: str, test_repo: Path, docker: Docker
) -> None:
    # Same-size edits: the context's incremental sync must still send the new wheel.
    _touch_halo(test_repo, "layer test A")
    first = halo("image", "build", "cpu", cwd=test_repo)
    assert first.returncode == 0, first.stderr[-2000:]
    a = built_ref(first.stdout, _repository(test_repo))
    _touch_halo(test_repo, "layer test B")
    second = halo("image", "build", "cpu", cwd=test_repo)
    assert second.returncode == 0, second.stderr[-2000:]
    b = built_ref(second.stdout, _repository(test_repo))
    before, after = docker.layers(a), docker.layers(b)
    print("layers before:", *before, sep="\n  ")
    print("layers after:", *after, sep="\n  ")
    assert len(before) == len(after) >= 3
    assert before[:-1] == after[:-1], "only halo's layer may change"
    assert before[-1] != after[-1]
    init = "/opt/venv/lib/python3.11/site-packages/halo/__init__.py"
    assert _run(docker, b, "tail", "-1", init).strip() == "# layer test B"
    # halo image diff names what changed: halo's files and the build record, nothing else.
    diff = halo("image", "diff", a, b, cwd=test_repo)
    assert diff.returncode == 1
    changed = [line.split(" ", 1)[1] for line in diff.stdout.splitlines()]
    assert init in changed and "/etc/halo/build.json" in changed
    site = "/opt/venv/lib/python3.11/site-packages/halo"
    assert all(p.startswith((site, "/etc/halo/")) for p in changed), changed


def test_a_corrupt_store_entry_fails_the_build_naming_the_fix_which_then_repairs_it(
    cpu_built: str, test_repo: Path, docker: Docker, tmp_path: Path
) -> None:
    lock = load_lock(test_repo / "pins" / "pylock.cpu.toml")
    victim = lock.package("execnet").artifacts[0]  # type: ignore[union-attr]
    real, copy = Store(store_root()), linked_store(tmp_path / "store", lock.artifacts)
    tampered = copy.path(victim.sha256)
    data = bytearray(real.path(victim.sha256).read_bytes())
    data[len(data) // 2] ^= 0x01
    tampered.unlink()
    tampered.write_bytes(bytes(data))

    _touch_halo(test_repo, "tamper test")  # a new input hash: a real build, not a no-op
    offline = {
        "HALO_STORE": str(copy.root),
        "HALO_INDEX_URL": "http://127.0.0.1:9/simple/",
        "HALO_SUBSTITUTES": "",
        "PIP_FIND_LINKS": "",
        "UV_FIND_LINKS": "",
    }
    proc = halo("image", "build", "cpu", cwd=test_repo, env=offline)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"halo: error: {victim.file}: store entry corrupted and not replaced ")
    assert docker.refs(_repository(test_repo)) == []
    fix = re.search(r"run `halo ([^`]+)`", last)
    assert fix is not None and fix.group(1) == "fetch cpu", last
    # The command it names, with the index back, repairs the entry and says so.
    repaired = halo(*fix.group(1).split(), cwd=test_repo, env={"HALO_STORE": str(copy.root)})
    assert repaired.returncode == 0, repaired.stderr[-2000:]
    assert f"repaired 1 corrupt store entry: {victim.file}" in repaired.stdout
    assert copy.check(victim.sha256, rehash=True) is None
    assert real.check(victim.sha256, rehash=True) is None  # the real store was never touched


def _sbom_is_the_locks(docker: Docker, ref: str, input_hash: str) -> None:
    """The image's SBOM validates against the CycloneDX schema; one sha256 per component, the lock's."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text = _run(docker, ref, "cat", "/etc/halo/sbom.cdx.json")
    doc = json.loads(text)
    assert (
        JsonStrictValidator(SchemaVersion.from_version(doc["specVersion"])).validate_str(text)
        is None
    )
    assert {"name": "halo:input-hash", "value": input_hash} in doc["metadata"]["properties"]
    shas = {c["name"]: [h["content"] for h in c["hashes"]] for c in doc["components"]}
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    assert {n: s for n, s in shas.items() if n != "halo-posttrain"} == {
        p.name: [p.artifacts[0].sha256] for p in lock.packages
    }
    assert len(shas["halo-posttrain"]) == 1


def test_image_carries_build_record_labels_and_sbom_and_no_build_time(
    cpu_built: str, docker: Docker
) -> None:
    out = _run(
        docker,
        cpu_built,
        "python",
        "-c",
        "import json; b=json.load(open('/etc/halo/build.json')); s=json.load(open('/etc/halo/sbom.cdx.json'));"
        "print(b['input_hash'], len(b['patches']), s['bomFormat'], sorted(c['name'] for c in s['components'])[:200])",
    )
    input_hash, n_patches, fmt, names = out.split(" ", 3)
    assert cpu_built.endswith(f":cpu-{input_hash[:12]}")
    assert docker.inspect(cpu_built, '{{index .Config.Labels "io.halo.input-hash"}}') == input_hash
    assert int(n_patches) >= 3 and fmt == "CycloneDX"
    assert "'torch'" in names and "'halo-posttrain'" in names
    _sbom_is_the_locks(docker, cpu_built, input_hash)
    assert _run(docker, cpu_built, "find", "/opt/venv", "-name", "__pycache__") == "", (
        "no bytecode caches are shipped"
    )
    info = docker.inspect_json(cpu_built)
    assert info["Created"].startswith(iso(DEFAULT_EPOCH).rstrip("Z")), info["Created"]
    labels = info["Config"]["Labels"]
    assert "org.opencontainers.image.revision" not in labels, "a commit is not an input"
    # Every file of every layer carries SOURCE_DATE_EPOCH or older: nothing from the build's clock.
    newer = _run(
        docker,
        cpu_built,
        "find",
        "/opt",
        "/etc/halo",
        "/workspace",
        "-newermt",
        f"@{DEFAULT_EPOCH}",
    )
    assert newer == ""


def test_an_artifact_missing_from_the_store_fails_the_build_naming_it(
    cpu_built: str, test_repo: Path, docker: Docker, tmp_path: Path
) -> None:
    lock = load_lock(test_repo / "pins" / "pylock.cpu.toml")
    missing = lock.package("iniconfig").artifacts[0]  # type: ignore[union-attr]
    copy = linked_store(tmp_path / "store", [a for a in lock.artifacts if a != missing])
    _touch_halo(test_repo, "missing artifact test")
    # No index and no substitutes: the build has nowhere to get it, and must say which it lacks.
    env = {
        "HALO_STORE": str(copy.root),
        "HALO_INDEX_URL": "http://127.0.0.1:9/simple/",
        "HALO_SUBSTITUTES": "",
        "PIP_FIND_LINKS": "",
        "UV_FIND_LINKS": "",
    }
    proc = halo("image", "build", "cpu", cwd=test_repo, env=env)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("halo: error: iniconfig: index unreachable") or missing.file in last, (
        last
    )
    assert "iniconfig" in last
    assert docker.refs(_repository(test_repo)) == []


def test_the_build_command_is_offline(tmp_path: Path) -> None:
    from halo.images.docker import Builder, build_argv

    for builder in (Builder("docker", buildx=True), Builder("docker", buildx=False)):
        argv = build_argv(
            builder,
            tmp_path,
            tmp_path / "Dockerfile",
            ["halo:cpu"],
            {},
            {},
            "none",
            tmp_path / "iid",
        )
        assert argv[argv.index("--network") + 1] == "none"


def test_plan_predicts_the_built_input_hash(cpu_built: str, docker: Docker) -> None:
    proc = halo("image", "plan", "cpu", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("input hash: "))
    planned = line.split()[2]
    assert docker.inspect(cpu_built, '{{index .Config.Labels "io.halo.input-hash"}}') == planned


SHIM = """#!{python}
import json, os, sys
argv = sys.argv
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"argv": argv, "cwd": os.getcwd(),
                         "env": {{"DOCKER_BUILDKIT": os.environ.get("DOCKER_BUILDKIT")}}}}) + "\\n")
if argv[1:2] == ["build"] or argv[1:3] == ["buildx", "build"]:
    sys.exit(97)  # recorded, not run: the comparison is the point, a real build is tested above
os.execv({real!r}, [{real!r}, *argv[1:]])
"""


class Counted:
    """Wraps a function and counts its calls (by a predicate on the arguments)."""

    def __init__(self, fn, when=lambda *a, **k: True) -> None:  # type: ignore[no-untyped-def]
        self.fn, self.when, self.calls = fn, when, 0

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += self.when(*args, **kwargs)
        return self.fn(*args, **kwargs)


def _count_evaluation(monkeypatch: pytest.MonkeyPatch, lock_name: str) -> tuple[Counted, Counted]:
    """(input hash computations, loads of the image's lock) in this process."""
    import halo.images.evaluate.inputs
    import halo.pins.lockfile

    hashed = Counted(halo.images.evaluate.inputs.image_inputs)
    monkeypatch.setattr(halo.images.evaluate.inputs, "image_inputs", hashed)
    loaded = Counted(halo.pins.lockfile.load_lock, lambda path: Path(path).name == lock_name)
    monkeypatch.setattr(halo.pins.lockfile, "load_lock", loaded)
    return hashed, loaded


def test_a_no_op_build_plans_once_without_parsing_the_lock(
    cpu_built: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from halo.images.build import build_image

    hashed, loaded = _count_evaluation(monkeypatch, "pylock.cpu.toml")
    catalog = load_catalog(REPO)
    built = build_image(REPO, catalog, catalog.image("cpu"), Store(store_root()))
    assert not built.rebuilt and f"halo:{built.image.name}-{built.inputs.hash[:12]}" == cpu_built
    assert (hashed.calls, loaded.calls) == (1, 0)


def test_the_build_runs_the_plans_command_verbatim_and_hashes_its_inputs_once(
    test_repo: Path, docker: Docker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recording `docker` (HALO_DOCKER) logs every call; its build is the plan's, verbatim."""
    from halo.errors import HaloError
    from halo.images.build import build_image

    log, shim = tmp_path / "docker.log", tmp_path / "bin" / "docker"
    shim.parent.mkdir()
    real = docker.builder.exe
    shim.write_text(SHIM.format(python=sys.executable, log=str(log), real=real))
    shim.chmod(0o755)
    monkeypatch.setenv("HALO_DOCKER", str(shim))
    _touch_halo(test_repo, "plan test")  # inputs of its own: not up to date, so it builds

    proc = halo("image", "plan", "cpu", "--json", cwd=test_repo)
    assert proc.returncode == 0, proc.stderr
    (plan,) = json.loads(proc.stdout)
    log.unlink()

    hashed, loaded = _count_evaluation(monkeypatch, "pylock.cpu.toml")
    catalog = load_catalog(test_repo)
    with pytest.raises(HaloError, match=r"failed with exit 97"):
        build_image(test_repo, catalog, catalog.image("cpu"), Store(store_root()))
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    builds = [c for c in calls if "build" in c["argv"][1:3]]
    assert builds == [
        {"argv": plan["command"]["argv"], **{k: plan["command"][k] for k in ("cwd", "env")}}
    ]
    assert plan["command"]["argv"][0] == str(shim)
    assert (hashed.calls, loaded.calls) == (1, 1), "one evaluation, one parse of the lock"


class DiskWatch:
    """The most disk a test took while it ran: free space sampled twice a second.

    Other users of the disk move the number too; it is a measurement to report, not a check.
    """

    def __init__(self, where: Path) -> None:
        self.where, self.start = where, shutil.disk_usage(where).free
        self.low, self._done = self.start, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.5):
            self.low = min(self.low, shutil.disk_usage(self.where).free)

    def peak(self) -> int:
        self._done.set()
        self._thread.join()
        return self.start - self.low


def _skip_or_fail(reason: str) -> None:
    """In CI this test must run: what would be a skip on a workstation fails there."""
    (pytest.fail if in_ci() else pytest.skip)(reason)


def _need_free(need: int, what: str) -> None:
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if free < need:
        _skip_or_fail(f"{what} needs {need / 2**30:.1f} GiB free, {free / 2**30:.1f} GiB free")


@dataclass(frozen=True)
class Private:
    """halo:cpu as built in the private engine: its environment, and the sizes that bound disk."""

    env: dict[str, str]  # DOCKER_HOST, a fresh HALO_STORE and XDG_CACHE_HOME
    build_need: int  # free bytes one build in the engine needs
    exe: str  # the docker CLI

    def drop_build_cache(self, keep_contexts: bool = False) -> None:
        """Give back what BuildKit keeps after a build (the engine's own; nobody else's)."""
        code = "from halo.images.docker import Docker; Docker.discover()"
        code += f".prune_build_cache(keep_contexts={keep_contexts})"
        env = {**os.environ, **self.env}
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)

    def build_records(self) -> dict[str, dict[str, object]]:
        """The engine's build cache records by ID (Description, Size, Shared: held by an image)."""
        argv = [self.exe, "system", "df", "--verbose", "--format", "{{json .BuildCache}}"]
        env = {**os.environ, **self.env}
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
        return {str(r["ID"]).rstrip("*"): r for r in json.loads(out or "[]") or []}


@pytest.fixture(scope="module")
def private_cpu(
    cpu_built: str, docker: Docker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Private]:
    """A second, private Docker engine (its own data root, exec root, socket: no layer, base
    or build cache of the shared one) with the base carried over, and a fresh store and cache.

    Disk is bounded and given back: the fresh store holds the lock's artifacts as hard links
    to the same verified bytes (no stamp, derivation record or source tree goes with them:
    every entry is hashed again by the build), and the engine, its data root, the store and
    the cache are removed when the module's tests are done.
    """
    catalog = load_catalog(REPO)
    image = catalog.image("cpu")
    lock = load_lock(REPO / "pins" / f"pylock.{image.pins}.toml")
    size = int(docker.inspect_json(cpu_built)["Size"])
    context = sum(a.size or 0 for a in lock.artifacts)
    # What one build takes in an engine, measured: the context BuildKit was sent, and the
    # image's layers twice (BuildKit's snapshots and the engine's layer store) until its
    # build cache is dropped; plus a GiB of slack.
    need = 2 * size + context + (1 << 30)
    _need_free(need, "a build in a second engine")
    try:
        engine = PrivateEngine("repro")
    except RuntimeError as exc:
        _skip_or_fail(f"needs a second Docker engine: {exc}")
    top = tmp_path_factory.mktemp("private")
    watch = DiskWatch(Path(tempfile.gettempdir()))
    try:
        # The base is an input, pinned by its image ID: carried over as it is, like a pull.
        # halo:cpu is not (5 GB saved and loaded, minutes): `--expect` names its ID instead.
        base = base_ref(catalog.bases[image.base], REPO)
        save = subprocess.Popen([docker.exe, "save", base], stdout=subprocess.PIPE)
        load = subprocess.run(
            [docker.exe, "load"],
            stdin=save.stdout,
            env={**os.environ, **engine.env},
            capture_output=True,
            check=False,
        )
        assert save.wait() == 0 and load.returncode == 0, load.stderr
        linked_store(top / "store", lock.artifacts)
        env = {**engine.env, "HALO_STORE": str(top / "store"), "XDG_CACHE_HOME": str(top / "cache")}
        yield Private(env, need, docker.exe)
    finally:
        peak = watch.peak()
        engine.stop()
        shutil.rmtree(top, ignore_errors=True)
        print(f"second engine: peak disk {peak / 2**30:.1f} GiB")


def test_same_inputs_give_the_same_image_id_in_another_engine_from_a_fresh_store(
    cpu_built: str, docker: Docker, private_cpu: Private
) -> None:
    """`halo image verify cpu --expect ID` in the private engine: halo:cpu built there from
    scratch (no layer cache, a fresh store) gives the image ID of the checkout's halo:cpu,
    however that was built (in CI: by build-cpu, in the shared engine, from its own store).
    This build runs under another umask, as a build host's user may: the context's folders were
    once made with it, and `cp -R` carried their modes into the image. The rebuild is the run's
    one cold build after build-cpu's; verify tags nothing, so the engine holds no halo:cpu."""
    expected = docker.image_id(cpu_built)
    assert expected
    argv = ("image", "verify", "cpu", "--expect", expected)
    there = halo(*argv, cwd=REPO, env=private_cpu.env, umask=0o027)
    assert there.returncode == 0, there.stdout + there.stderr[-3000:]
    assert "Successfully installed" in there.stderr and "torch-" in there.stderr, "built there"
    row = next(li for li in there.stdout.splitlines() if li.startswith("halo:cpu "))
    assert row.split()[1:4] == [expected[:19], expected[:19], "same"], there.stdout
    # What image-check does between its images: what a full prune drops goes, but for the
    # synced context, so the next build on it sends only what changed.
    before = private_cpu.build_records()
    contexts = {k for k, r in before.items() if r["Description"] == CONTEXT_RECORD}
    assert any(before[k]["Size"] != "0B" for k in contexts), before  # the wheels went over
    private_cpu.drop_build_cache(keep_contexts=True)
    kept = set(private_cpu.build_records())
    assert contexts <= kept < set(before), (before, kept)
    private_cpu.drop_build_cache()
    after = set(private_cpu.build_records())
    assert kept - contexts <= after and not contexts & after, (before, kept, after)
