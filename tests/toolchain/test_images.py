"""The image catalog, input hashes, and bad input failing closed with one line."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from support import REPO, halo, tree_listing

from halo.errors import HaloError
from halo.images.base import BaseState
from halo.images.buildplan import resolve_inputs
from halo.images.catalog import load_catalog, parse_catalog, selected
from halo.images.wheel import build_wheel

GOOD = """
bases:
  b:
    recipe: mmdebstrap
    suite: bookworm
    packages: [python3]
    python: python3
images:
  cpu:
    repository: halo
    tag: cpu
    dockerfile: images/training/Dockerfile
    pins: cpu
    base: b
    tiers: [cpu]
    publish: halo
"""


def test_catalog_parses_the_shipped_file() -> None:
    catalog = load_catalog(Path(__file__).resolve().parents[2])
    products = {"cpu", "blackwell", "hopper", "vllm", "sglang"}
    assert set(catalog.images) == products | {"blackwell-stack", "hopper-stack"}
    # --all is the products; a stage (base + locked stack, kernels omitted) is built by name.
    assert {i.name for i in selected(catalog, [], True)} == products
    for name in ("blackwell", "hopper"):
        stage, product = catalog.images[f"{name}-stack"], catalog.images[name]
        assert stage.stage_of == name and stage.repository == "halo-stack" and not stage.sources
        assert (stage.pins, stage.dockerfile, stage.cuda_arch) == (
            product.pins,
            product.dockerfile,
            product.cuda_arch,
        )
    assert catalog.images["blackwell"].cuda_arch == ("10.0",)  # one arch per image; runs on 10.3
    assert catalog.images["hopper"].cuda_arch == ("9.0a",)
    # One training Dockerfile serves all three training images.
    assert {catalog.images[n].dockerfile for n in ("cpu", "blackwell", "hopper")} == {
        "images/training/Dockerfile"
    }
    # One server Dockerfile serves both rollout servers, told which by its build arguments.
    assert {catalog.images[n].dockerfile for n in ("vllm", "sglang")} == {
        "images/server/Dockerfile"
    }
    assert catalog.images["vllm"].args == (("PORT", "8000"), ("SERVER", "vllm"))
    assert catalog.images["sglang"].args == (("PORT", "30000"), ("SERVER", "sglang"))
    assert catalog.images["cpu"].args == ()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda s: s.replace("  cpu:\n", "  cpu:\n    colour: red\n"),
            r"images\.cpu\.colour: unknown key",
        ),
        (lambda s: s.replace("base: b", "base: nope"), r"images\.cpu\.base: unknown base 'nope'"),
        (
            lambda s: s.replace("    publish: halo\n", "    publish: halo\n    stage_of: cpu\n"),
            r"images\.cpu\.stage_of: 'cpu' is not a product image here",
        ),
        (
            lambda s: s.replace("recipe: mmdebstrap", "recipe: magic"),
            r"bases\.b\.recipe: Input should be 'mmdebstrap'",
        ),
        (
            lambda s: s.replace("    repository: halo\n", ""),
            r"images\.cpu\.repository: Field required",
        ),
        (
            lambda s: s.replace("    dockerfile: images/training/Dockerfile\n", ""),
            r"images\.cpu\.dockerfile: Field required",
        ),
        (lambda s: s + "  x: [unclosed\n", r"not valid YAML: .*line \d+"),
        # YAML reads 0.10 as the number 0.1: a tag must be written as a string.
        (
            lambda s: s.replace("tag: cpu", "tag: 0.10"),
            r"images\.cpu\.tag: Value error, expected a string, YAML read a number: put the value in quotes, got 0\.1",
        ),
        (
            lambda s: s.replace("tag: cpu", "tag: cpu latest"),
            r"images\.cpu\.tag: Value error, expected an OCI tag",
        ),
        (
            lambda s: s.replace("tag: cpu", 'tag: "-cpu"'),
            r"images\.cpu\.tag: Value error, expected an OCI tag",
        ),
        (
            lambda s: s.replace("tag: cpu", f"tag: {'x' * 116}"),
            r"images\.cpu\.tag: Value error, expected an OCI tag",
        ),
        (
            lambda s: s.replace("repository: halo", "repository: hälo"),
            r"images\.cpu\.repository: Value error, expected an OCI repository name",
        ),
        (
            lambda s: s.replace("repository: halo", "repository: Halo"),
            r"images\.cpu\.repository: Value error, expected an OCI repository name",
        ),
        (
            lambda s: s.replace("tiers: [cpu]", "tiers: [cpu, gpu]"),
            r"images\.cpu\.tiers\[1\]: unknown tier 'gpu'",
        ),
        (
            lambda s: s.replace("tiers: [cpu]", "tiers: cpu"),
            r"images\.cpu\.tiers: Input should be a valid list",
        ),
        (
            lambda s: s.replace("    pins: cpu\n", "    pins: cpu\n    pins: gpu\n"),
            r"duplicate key 'pins'",
        ),
        (
            lambda s: s.replace("python: python3", "python: 3"),
            r"bases\.b\.python: Input should be a valid string",
        ),
        (
            lambda s: s.replace("    suite: bookworm\n", ""),
            r"bases\.b\.suite: Field required",
        ),
        (
            lambda s: s.replace("images:\n  cpu:", "images: []\nimagez:\n  cpu:"),
            r"images: Input should be a valid dictionary",
        ),
        (lambda s: "", r"\(top level\): Input should be a valid dictionary"),
        (
            lambda s: s.replace("  cpu:\n", "  cpu:\n    args: [SERVER]\n"),
            r"images\.cpu\.args: Input should be a valid dictionary",
        ),
        (
            lambda s: s.replace("  cpu:\n", "  cpu:\n    args: {server: vllm}\n"),
            r"images\.cpu\.args\.server.*expected an upper-case build argument name",
        ),
        (
            lambda s: s.replace("  cpu:\n", "  cpu:\n    args: {PORT: 8000}\n"),
            r"images\.cpu\.args\.PORT: Input should be a valid string",
        ),
        (
            lambda s: s.replace("  cpu:\n", "  cpu:\n    args: {BASE: x}\n"),
            r"images\.cpu\.args\.BASE: set by halo itself",
        ),
    ],
)
def test_catalog_errors_name_the_key(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(HaloError, match=message) as err:
        parse_catalog(mutate(GOOD), Path("images/images.yaml"))
    assert "\n" not in err.value.message


def test_catalog_reports_every_problem_at_once() -> None:
    bad = GOOD.replace("tag: cpu", "tag: 0.10").replace("tiers: [cpu]", "tiers: [gpu]")
    bad = bad.replace("recipe: mmdebstrap", "recipe: magic")
    with pytest.raises(HaloError) as err:
        parse_catalog(bad, Path("images/images.yaml"))
    line = err.value.message
    assert line.startswith("images/images.yaml: 3 problems: "), line
    for key in ("bases.b.recipe: ", "images.cpu.tag: ", "images.cpu.tiers[0]: "):
        assert key in line


def test_catalog_dockerfiles_must_exist(repo_copy: Path) -> None:
    catalog = repo_copy / "images" / "images.yaml"
    catalog.write_text(
        catalog.read_text().replace("images/training/Dockerfile", "images/trainin/Dockerfile")
    )
    with pytest.raises(
        HaloError, match=r"images\.cpu\.dockerfile: no such file images/trainin/Dockerfile"
    ):
        load_catalog(repo_copy)


def test_every_base_is_locked_debian_and_only_gpu_images_carry_the_nvidia_contract() -> None:
    catalog = load_catalog(REPO)
    assert {b.recipe for b in catalog.bases.values()} == {"mmdebstrap"}  # no registry, no FROM
    assert {b.python for b in catalog.bases.values()} == {"python3"}  # Debian 12's CPython 3.11
    for name in catalog.bases:
        assert (REPO / "pins" / f"debian.{name}.lock.toml").is_file(), name
    assert dict(catalog.bases[catalog.images["cpu"].base].env) == {}
    for name in ("blackwell", "hopper", "vllm", "sglang"):
        env = dict(catalog.bases[catalog.images[name].base].env)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all", name
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility", name
        assert env["NVIDIA_REQUIRE_CUDA"] == "cuda>=13.0", name
        assert "/usr/local/nvidia/lib64" in env["LD_LIBRARY_PATH"].split(":"), name


def test_base_env_names_are_checked_and_enter_the_recipe_hash() -> None:
    from halo.images.base import recipe_hash

    with pytest.raises(HaloError, match=r"bases\.b\.env\.nvidia.*upper-case environment"):
        parse_catalog(
            GOOD.replace("    python: python3\n", "    python: python3\n    env: {nvidia: x}\n"),
            Path("images.yaml"),
        )
    catalog = load_catalog(REPO)
    base = catalog.bases["debian12-gpu"]
    import dataclasses

    assert recipe_hash(base, REPO) != recipe_hash(dataclasses.replace(base, env=()), REPO)


def _one_error_line(proc) -> str:  # type: ignore[no-untyped-def]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_malformed_catalog_is_one_line_exit_2_nothing_written(
    repo_copy: Path, isolated_env: dict[str, str], tmp_path: Path
) -> None:
    (repo_copy / "images" / "images.yaml").write_text("images:\n  cpu: [unclosed\n")
    proc = halo("image", "build", "cpu", cwd=repo_copy, env=isolated_env)
    assert proc.returncode == 2
    assert _one_error_line(proc).startswith(
        f"halo: error: {repo_copy}/images/images.yaml: not valid YAML: "
    )
    assert tree_listing(tmp_path / "store") == tree_listing(tmp_path / "cache") == []


def test_unknown_image_is_one_line_exit_2(
    repo_copy: Path, isolated_env: dict[str, str], tmp_path: Path
) -> None:
    proc = halo("image", "build", "gpu9000", cwd=repo_copy, env=isolated_env)
    assert proc.returncode == 2
    assert (
        "unknown image 'gpu9000' (known: blackwell, blackwell-stack, cpu, hopper, hopper-stack, "
        "sglang, vllm)" in _one_error_line(proc)
    )
    assert tree_listing(tmp_path / "cache") == []


def test_missing_lock_is_one_line_exit_2(
    repo_copy: Path, isolated_env: dict[str, str], tmp_path: Path
) -> None:
    (repo_copy / "pins" / "pylock.cpu.toml").unlink()
    for argv in (("image", "build", "cpu"), ("fetch", "cpu")):
        proc = halo(*argv, cwd=repo_copy, env=isolated_env)
        assert proc.returncode == 2, argv
        assert (
            _one_error_line(proc)
            == f"halo: error: {repo_copy}/pins/pylock.cpu.toml: lock not found; run `halo pins lock cpu`"
        )
    assert tree_listing(tmp_path / "store") == tree_listing(tmp_path / "cache") == []


def _inputs(repo: Path, name: str = "cpu"):  # type: ignore[no-untyped-def]
    catalog = load_catalog(repo)
    return resolve_inputs(repo, catalog, catalog.image(name), docker=None)


def test_input_hash_is_stable_and_independent_of_the_checkout_path(
    repo_copy: Path, tmp_path: Path
) -> None:

    other = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(repo_copy, other)
    for name in ("cpu", "blackwell", "hopper", "vllm", "sglang"):
        assert (
            _inputs(repo_copy, name).hash
            == _inputs(other, name).hash
            == _inputs(repo_copy, name).hash
        )


def test_the_server_images_differ_by_their_build_arguments(repo_copy: Path) -> None:
    """One Dockerfile, two servers: the catalog's args are inputs, or both would share a hash."""
    vllm = _inputs(repo_copy, "vllm")
    assert vllm.parts["build_args"]["SERVER"] == "vllm"  # type: ignore[index]
    assert _inputs(repo_copy, "sglang").parts["build_args"]["SERVER"] == "sglang"  # type: ignore[index]
    catalog = repo_copy / "images" / "images.yaml"
    catalog.write_text(catalog.read_text().replace('PORT: "8000"', 'PORT: "8001"'))
    assert _inputs(repo_copy, "vllm").hash != vllm.hash


@pytest.mark.parametrize(
    "path",
    [
        "halo/__init__.py",
        "patches/README.md",
        "images/training/Dockerfile",
        "pins/pylock.cpu.toml",
        "README.md",  # the build backend writes it into halo's wheel
    ],
)
def test_input_hash_covers(repo_copy: Path, path: str) -> None:
    before = _inputs(repo_copy).hash
    target = repo_copy / path
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a") as fh:
        fh.write("\n# changed\n")
    assert _inputs(repo_copy).hash != before


def test_input_hash_covers_an_executable_bit_the_wheel_keeps(repo_copy: Path) -> None:
    before = _inputs(repo_copy).hash
    (repo_copy / "halo" / "cli.py").chmod(0o755)
    assert _inputs(repo_copy).hash != before


def test_input_hash_ignores_bytecode_and_caches(repo_copy: Path) -> None:
    before = _inputs(repo_copy).hash
    cache = repo_copy / "halo" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "cli.cpython-311.pyc").write_bytes(b"\0junk")
    assert _inputs(repo_copy).hash == before


def test_a_base_enters_the_hash_by_its_recipe_never_a_local_id() -> None:
    from halo.images.inputs import base_identity

    made = BaseState("halo-base/x:1", "sha256:" + "a" * 64)
    assert base_identity(made, "r") == "recipe:r" == base_identity(BaseState(made.ref, None), "r")


def test_halo_wheel_is_built_by_the_backend_as_a_pure_function_of_the_source(
    repo_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import zipfile

    a = build_wheel(repo_copy, tmp_path / "a")
    with zipfile.ZipFile(a) as zf:
        wheel_meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/WHEEL")))
    assert b"Generator: hatchling" in wheel_meta
    # Another checkout: other mtimes, a caller's SOURCE_DATE_EPOCH; the same bytes.
    other = tmp_path / "other"
    shutil.copytree(repo_copy, other)
    for path in (other / "halo").rglob("*.py"):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1234567890")
    b = build_wheel(other, tmp_path / "b")
    assert a.name == b.name
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    (repo_copy / "halo" / "__init__.py").write_text(
        (repo_copy / "halo" / "__init__.py").read_text() + "# x\n"
    )
    c = build_wheel(repo_copy, tmp_path / "c")
    assert hashlib.sha256(c.read_bytes()).digest() != hashlib.sha256(a.read_bytes()).digest()


def test_halo_wheel_refuses_a_backend_other_than_the_pinned_one(repo_copy: Path) -> None:
    pyproject = repo_copy / "pyproject.toml"
    text = pyproject.read_text()
    assert 'requires = ["hatchling==' in text
    pyproject.write_text(text.replace('requires = ["hatchling==', 'requires = ["hatchling==0.0.1+'))
    with pytest.raises(HaloError, match=r"build-system\.requires: 'hatchling==0\.0\.1\+"):
        build_wheel(repo_copy, repo_copy / "out")


@pytest.mark.parametrize("name", ["blackwell", "hopper", "vllm", "sglang"])
def test_plan_for_each_gpu_image(name: str, repo_copy: Path, isolated_env: dict[str, str]) -> None:
    first = halo("image", "plan", name, cwd=repo_copy, env=isolated_env)
    assert first.returncode == 0, first.stderr
    out = first.stdout
    for section in (
        "input hash: ",
        "stages:",
        "artifacts: ",
        "estimated uncompressed size by layer:",
        "build command",
    ):
        assert section in out, section
    assert "--network none" in out
    if name in {"vllm", "sglang"}:
        assert "-f images/server/Dockerfile --build-arg BASE=" in out
        assert f"--build-arg SERVER={name} " in out
    assert "torch " in out or "torch  " in out
    again = halo("image", "plan", name, cwd=repo_copy, env=isolated_env)
    assert again.stdout == out, "a plan is a pure function of the checkout"


def test_plan_json_is_the_build_as_data(isolated_env: dict[str, str]) -> None:
    """`halo image plan --json`: inputs and their hash, stages, artifacts equal to the lock's,
    the context and the exact build command; the text plan says the same hash and command."""
    from halo.hashing import sha256_json
    from halo.images.plan import local_docker
    from halo.pins.lockfile import load_lock, lock_path

    proc = halo("image", "plan", "cpu", "--json", cwd=REPO, env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    (plan,) = json.loads(proc.stdout)
    assert plan["image"] == "cpu"
    catalog = load_catalog(REPO)
    here = resolve_inputs(REPO, catalog, catalog.image("cpu"), local_docker())
    assert plan["input_hash"] == here.hash == sha256_json(plan["inputs"])
    assert plan["immutable_ref"].endswith("-" + plan["input_hash"][:12])
    assert [s["stage"] for s in plan["stages"]] == ["runtime"]
    assert plan["derivations"] == []
    lock = load_lock(lock_path(REPO / "pins", "cpu"))
    assert plan["lock"] == "pins/pylock.cpu.toml"
    assert {(a["file"], a["sha256"], a["size"]) for a in plan["artifacts"]} == {
        (a.file, a.sha256, a.size) for a in lock.artifacts
    }
    assert not any(a["in_store"] for a in plan["artifacts"]), "an empty store has none"
    cmd = plan["command"]
    argv = cmd["argv"]
    assert cmd["env"] == {"DOCKER_BUILDKIT": "1"} and cmd["cwd"] == str(REPO)
    assert argv[argv.index("--network") + 1] == "none"
    assert argv[argv.index("-f") + 1] == "images/training/Dockerfile"
    assert argv[argv.index("--iidfile") + 1] == plan["iidfile"]
    assert argv[-1] == plan["context"] != plan["iidfile"]
    assert Path(plan["context"]).is_relative_to(isolated_env["XDG_CACHE_HOME"])
    assert f"io.halo.input-hash={plan['input_hash']}" in argv
    assert "-t" not in argv, "the raw build is untagged; the normalised image gets the tags"
    text = halo("image", "plan", "cpu", cwd=REPO, env=isolated_env).stdout
    assert f"input hash: {plan['input_hash']}\n" in text
    assert "  DOCKER_BUILDKIT=1 " + " ".join(argv) + "\n" in text + "\n"


def test_manifest_diff_names_added_removed_and_changed_files() -> None:
    from halo.images.manifest import diff_manifests

    left = {"/opt/venv/a": "1", "/opt/venv/b": "2", "/etc/halo/build.json": "3"}
    right = {"/opt/venv/a": "1", "/opt/venv/b": "9", "/opt/venv/c": "4"}
    assert diff_manifests(left, right) == [
        "- /etc/halo/build.json",
        "~ /opt/venv/b",
        "+ /opt/venv/c",
    ]
    assert diff_manifests(left, dict(left)) == []


def test_a_remembered_catalog_is_checked_again_when_it_or_its_dockerfiles_change(
    repo_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from halo.images.catalog import remember

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = load_catalog(repo_copy)
    assert not (tmp_path / "cache").exists(), "remembered only after a command succeeded"
    remember(first)
    (memo,) = (tmp_path / "cache" / "halo" / "validated").glob("catalog-*.json")
    assert load_catalog(repo_copy) == first
    dockerfile = repo_copy / "images" / "server" / "Dockerfile"
    text = dockerfile.read_text()
    dockerfile.unlink()
    with pytest.raises(HaloError, match=r"images\.vllm\.dockerfile: no such file"):
        load_catalog(repo_copy)
    dockerfile.write_text(text)
    assert load_catalog(repo_copy).memo is None, "read back from the memo"
    memo.write_text("{not json")
    assert load_catalog(repo_copy) == first, "a broken memo is only a miss"
    catalog = repo_copy / "images" / "images.yaml"
    catalog.write_text(catalog.read_text().replace('tag: "0.26.0"', "tag: 0.26"))
    with pytest.raises(HaloError, match=r"images\.vllm\.tag: Value error, expected a string"):
        load_catalog(repo_copy)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["cpu", "--expect", "nope"], "--expect: expected an image ID (sha256:<64 hex digits>)"),
        (["cpu", "--expect", "sha256:" + "A" * 64], "--expect: expected an image ID"),
        (["cpu", "vllm", "--expect", "a" * 64], "--expect: name exactly one image"),
    ],
)
def test_verify_expect_refuses_a_bad_id_or_many_images_before_building(
    argv: list[str], line: str
) -> None:
    proc = halo("image", "verify", *argv, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    (only,) = proc.stderr.strip().splitlines()
    assert only.startswith("halo: error: ") and line in only, only
    assert proc.stdout == ""
