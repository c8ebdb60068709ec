"""The cuda-builder set: the toolchain that compiles the training sets' kernels, in step with them."""

from __future__ import annotations

from support import REPO
from test_pins_invariants import lock, pkg

from halo.pins.invariants import Pins, Policy, builder_matches, check, override_allowed
from halo.pins.lockfile import load_lock
from halo.pins.locking import load_all

TRAINING = (pkg("torch", "2.11.0"), pkg("nvidia-nccl-cu13", "2.30.7"), pkg("numpy", "1.26.4"))


def test_the_builder_shares_every_common_version_with_the_training_sets() -> None:
    builder = lock("cuda-builder", pkg("torch", "2.11.0"), pkg("nvidia-cuda-nvcc", "13.0.88"))
    ok = Pins({"blackwell": lock("blackwell", *TRAINING), "cuda-builder": builder})
    assert list(builder_matches(ok, Policy())) == []
    drifted = lock("cuda-builder", pkg("torch", "2.10.0"), pkg("nvidia-cuda-nvcc", "13.0.88"))
    bad = Pins({"blackwell": lock("blackwell", *TRAINING), "cuda-builder": drifted})
    assert [str(v) for v in builder_matches(bad, Policy())] == [
        "blackwell: torch: builder-matches (2.11.0 here, 2.10.0 in cuda-builder, which compiles "
        "this set's kernels; re-lock both)"
    ]
    assert [v.rule for v in check(bad)].count("builder-matches") == 1


def test_an_nccl_override_is_allowed_in_every_set_and_nothing_else_is() -> None:
    nccl = lock("cpu", *TRAINING)
    nccl.extra["overrides"] = ["nvidia-nccl-cu13==2.30.7"]
    assert list(override_allowed(Pins({"cpu": nccl}), Policy())) == []
    other = lock("cpu", *TRAINING)
    other.extra["overrides"] = ["numpy==2.3.5"]
    assert [v.rule for v in override_allowed(Pins({"cpu": other}), Policy())] == [
        "override-allowed"
    ]


def test_the_committed_builder_lock_compiles_with_the_training_stack() -> None:
    state = load_all(REPO / "pins")
    builder = load_lock(REPO / "pins" / "pylock.cuda-builder.toml")
    names = {p.name for p in builder.packages}
    assert {
        "torch",
        "nvidia-cuda-nvcc",
        "nvidia-cuda-cccl",
        "nvidia-cuda-crt",
        "nvidia-nvvm",
    } <= names
    assert builder.package("nvidia-nccl-cu13").version == "2.30.7"  # type: ignore[union-attr]
    for training in ("blackwell", "hopper"):
        jit = state.locks[training]
        for name in ("nvidia-cuda-nvcc", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-nvvm"):
            assert jit.package(name) is not None, f"{training} lacks {name} (DeepEP's JIT)"
    assert not [v for v in check(Pins(state.locks, state.sources)) if v.rule == "builder-matches"]
