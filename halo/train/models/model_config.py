"""The ``model.config`` section checked by the transformers config class of its ``model_type``.

A fresh model is built from a dict (``model.config``), so a typo (``num_hiden_layers``) would
otherwise be stored as an unknown attribute and the run would train some other model in
silence. Checked here, every problem one ``model.config.<key>: ...`` entry:

- names: each key must be a field of the class (or a legacy name the class consumes, such as
  ``rope_theta``); an unknown one is named with the nearest valid name;
- sizes (layer, head, hidden, vocabulary and expert counts: keys ending in ``_size``,
  ``_dim``, ``_heads``, ``_layers``, ``_experts``, or starting ``num_``) are integers >= 1;
- probabilities (``*dropout*``, ``*_prob``, ``*_pdrop``) lie in [0, 1];
- whatever the class itself rejects (a wrong type, heads that do not divide the width).

The name and range rules need nothing; the class rules need transformers, which the trainer
always has. A host without it (a login node with only the toolchain) skips them, and the
trainer applies them before it builds anything.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import re
from typing import Any

SIZE = re.compile(r"(^num_.*|.*_(size|dim|heads|layers|experts|per_tok))$")
# Counts that may be 0 by design (no shared expert, no extra prediction layer, ...).
MAY_BE_ZERO = {
    "first_k_dense_replace",
    "max_window_layers",
    "n_shared_experts",
    "num_nextn_predict_layers",
    "num_shared_experts",
    "shared_expert_intermediate_size",
}
PROBABILITY = re.compile(r".*(dropout.*|_prob|_pdrop|_probability)$")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def range_errors(fields: dict[str, Any]) -> list[str]:
    """Sizes >= 1 and probabilities in [0, 1], by the key's name (no transformers needed)."""
    errors = []
    for key, value in fields.items():
        where = f"model.config.{key}"
        if SIZE.fullmatch(key) and isinstance(value, int) and not isinstance(value, bool):
            low = 0 if key in MAY_BE_ZERO else 1
            if value < low:
                errors.append(f"{where}: expected a size >= {low}, got {value}")
        elif (
            PROBABILITY.fullmatch(key)
            and _number(value)
            and not (math.isfinite(value) and 0 <= value <= 1)
        ):
            errors.append(f"{where}: expected a probability in [0, 1], got {value}")
    return errors


def config_class(model_type: str) -> Any | None:
    """The transformers config class of ``model_type``; None where transformers is absent.

    Imported by its own module: the auto-config mapping would import every model family.
    """
    try:
        from transformers.models.auto import configuration_auto as auto
    except (ImportError, ValueError):  # ValueError: a package set to None in sys.modules
        return None
    name = auto.CONFIG_MAPPING_NAMES.get(model_type)
    if name is None:
        return None  # transformers' own message (halo.train.models.hf.hf_config) names the types
    module = importlib.import_module(
        f"transformers.models.{auto.model_type_to_module_name(model_type)}"
    )
    return getattr(module, name)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def class_errors(cls: Any, fields: dict[str, Any]) -> list[str]:
    """Unknown keys (with the nearest name), then what the class rejects on construction."""
    known = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    known |= set(getattr(cls, "attribute_map", {}) or {})
    try:
        conf = cls(**fields)
    except Exception as exc:  # the class's own validators: whatever they raise is the answer
        return [f"model.config: not a usable model config ({_one_line(exc)})"]
    # A key the class neither declares nor consumes (legacy names such as rope_theta are
    # consumed) is kept as a stray attribute: that is an unknown key.
    errors = []
    for key in fields:
        if key in known or key not in vars(conf):
            continue
        near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else ""
        errors.append(f"model.config.{key}: not a field of {cls.__name__}{hint}")
    return errors


def errors(config: dict[str, Any], model_class: bool = True) -> list[str]:
    """Every problem of a ``model.config`` dict (model_type already checked to be a string);
    without ``model_class``, only the ranges (no transformers, no torch)."""
    fields = {k: v for k, v in config.items() if k != "model_type"}
    found = range_errors(fields)
    if found or not model_class:
        return found  # the class would only repeat them less clearly
    cls = config_class(str(config["model_type"]))
    return class_errors(cls, fields) if cls is not None else []
