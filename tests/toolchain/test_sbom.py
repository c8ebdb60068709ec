"""The image SBOM: CycloneDX from the lock, valid against the schema, one sha256 per component."""

from __future__ import annotations

import json

import pytest
from support import REPO

from halo.errors import HaloError
from halo.images.sbom import INPUT_HASH_PROPERTY, check_installed, image_sbom
from halo.pins.lockfile import load_lock

INPUT_HASH = "0123456789abcdef" * 4
HALO_WHEEL = ("halo_posttrain-0.1.0-py3-none-any.whl", "a" * 64)
KERNEL_WHEEL = ("deep_ep-2.1.0-cp312-cp312-linux_x86_64.whl", "b" * 64)


def validate(text: str) -> None:
    """Against the CycloneDX JSON schema the library ships, independently of halo.images.sbom."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    doc = json.loads(text)
    version = SchemaVersion.from_version(doc["specVersion"])
    assert JsonStrictValidator(version).validate_str(text) is None


@pytest.fixture(scope="module")
def cpu() -> tuple[str, dict[str, object]]:
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    text = image_sbom(lock, "halo:cpu-0123456789ab", INPUT_HASH, [HALO_WHEEL])
    return text, json.loads(text)


def sha256_by_ref(doc: dict[str, object]) -> dict[str, list[str]]:
    return {
        c["bom-ref"]: [h["content"] for h in c["hashes"] if h["alg"] == "SHA-256"]
        for c in doc["components"]  # type: ignore[attr-defined]
    }


def test_sbom_is_valid_cyclonedx_with_the_locks_sha256_for_every_component(
    cpu: tuple[str, dict[str, object]],
) -> None:
    text, doc = cpu
    validate(text)
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    by_name = {c["name"]: c for c in doc["components"]}  # type: ignore[attr-defined]
    assert set(by_name) == {p.name for p in lock.packages} | {"halo-posttrain"}
    for pkg in lock.packages:
        comp = by_name[pkg.name]
        (art,) = pkg.artifacts
        assert comp["version"] == pkg.version
        assert comp["purl"] == f"pkg:pypi/{pkg.name}@{pkg.version}?file_name={art.file}"
        assert [h["content"] for h in comp["hashes"]] == [art.sha256]
    assert by_name["halo-posttrain"]["hashes"] == [{"alg": "SHA-256", "content": "a" * 64}]
    assert all(len(shas) == 1 for shas in sha256_by_ref(doc).values())


def test_sbom_carries_the_locks_dependency_graph_and_the_input_hash(
    cpu: tuple[str, dict[str, object]],
) -> None:
    _, doc = cpu
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    ref = {c["name"]: c["bom-ref"] for c in doc["components"]}  # type: ignore[attr-defined]
    graph = {d["ref"]: set(d.get("dependsOn", [])) for d in doc["dependencies"]}  # type: ignore[attr-defined]
    for pkg in lock.packages:
        assert graph[ref[pkg.name]] == {ref[d] for d in pkg.dependencies}, pkg.name
    # The image depends on what nothing else pulls in: its requirements and halo itself.
    depended = set().union(*(graph[ref[p.name]] for p in lock.packages))
    assert graph["halo:cpu-0123456789ab"] == set(ref.values()) - depended
    assert {ref["torch"], ref["halo-posttrain"], ref["pytest-xdist"]} <= graph[
        "halo:cpu-0123456789ab"
    ]
    meta = doc["metadata"]
    assert {"name": INPUT_HASH_PROPERTY, "value": INPUT_HASH} in meta["properties"]  # type: ignore[index]
    assert meta["component"]["version"] == INPUT_HASH  # type: ignore[index]


def test_sbom_is_a_pure_function_of_its_inputs(cpu: tuple[str, dict[str, object]]) -> None:
    text, doc = cpu
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    assert image_sbom(lock, "halo:cpu-0123456789ab", INPUT_HASH, [HALO_WHEEL]) == text
    other = json.loads(image_sbom(lock, "halo:cpu-fedcba987654", "f" * 64, [HALO_WHEEL]))
    assert other["serialNumber"] != doc["serialNumber"]
    assert doc["metadata"]["timestamp"] == "2026-11-01T00:00:00+00:00"  # type: ignore[index]


def test_kernels_are_components_with_their_derivations_sha256() -> None:
    lock = load_lock(REPO / "pins" / "pylock.blackwell.toml")
    text = image_sbom(lock, "halo:blackwell-x", INPUT_HASH, [KERNEL_WHEEL, HALO_WHEEL])
    validate(text)
    comp = next(c for c in json.loads(text)["components"] if c["name"] == "deep-ep")
    assert comp["version"] == "2.1.0" and comp["hashes"][0]["content"] == "b" * 64


def test_a_package_in_the_image_twice_is_refused() -> None:
    lock = load_lock(REPO / "pins" / "pylock.cpu.toml")
    torch = next(p for p in lock.packages if p.name == "torch")
    twice = (f"torch-{torch.version}-py3-none-any.whl", "c" * 64)
    with pytest.raises(HaloError, match="torch is in the image twice"):
        image_sbom(lock, "halo:cpu-x", INPUT_HASH, [twice])


def test_stamp_refuses_an_sbom_that_does_not_describe_the_environment(
    cpu: tuple[str, dict[str, object]],
) -> None:
    _, doc = cpu
    installed = {c["name"]: c["version"] for c in doc["components"]}  # type: ignore[attr-defined]
    check_installed(doc, installed)
    with pytest.raises(HaloError, match=r"torch 0\.0\.1 is installed but the SBOM says 2\.11\.0"):
        check_installed(doc, {**installed, "torch": "0.0.1"})
    with pytest.raises(HaloError, match=r"stray 1\.0 is installed but the SBOM says nothing"):
        check_installed(doc, {**installed, "stray": "1.0"})
    del installed["pip"]
    with pytest.raises(HaloError, match=r"pip 26\.3 is in the SBOM, not installed"):
        check_installed(doc, installed)
