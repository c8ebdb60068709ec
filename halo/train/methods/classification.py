"""Sequence classification: a linear head on a causal LM's last hidden state.

The model is the LM's backbone (transformers' ``AutoModel``: the causal LM without its LM
head, loaded from a pretrained causal LM or built fresh from ``model.config``) and a
``score`` layer, laid out exactly as transformers' ``*ForSequenceClassification``: the same
parameter names, so a checkpoint is that class's checkpoint and ``halo export`` gives a folder
``pipeline("text-classification")`` loads. A text's logits are the head applied at its last
non-pad token, where a causal model has read the whole text (the rightmost token that is not
padding, as transformers pools). The loss is the cross-entropy of the labels, averaged over
the global batch; the eval set reports accuracy and macro-F1 beside its loss.

Rows and labels: halo.train.methods.classification_data (no torch there).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from halo.errors import HaloError
from halo.train.config import Classification, Config, Model
from halo.train.data import batching
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import classification_data as cd
from halo.train.models import hf
from halo.train.state import Batch, Method


def last_token(attention_mask: torch.Tensor) -> torch.Tensor:
    """Per row, the index of the rightmost token that is not padding (either padding side)."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (positions * attention_mask).argmax(-1)


class Classifier(nn.Module):
    """A backbone under its transformers name (``model``) and ``score``: state-dict keys as in
    transformers' ``*ForSequenceClassification``."""

    def __init__(self, backbone: nn.Module, config: Any) -> None:
        super().__init__()
        self.prefix = getattr(backbone, "base_model_prefix", "") or "model"
        setattr(self, self.prefix, backbone)
        hidden = config.get_text_config().hidden_size
        self.score = nn.Linear(hidden, config.num_labels, bias=False)
        nn.init.normal_(self.score.weight, std=getattr(config, "initializer_range", 0.02))
        self.config = config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool = False,
        **kwargs: Any,
    ) -> SimpleNamespace:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = getattr(self, self.prefix)(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return SimpleNamespace(logits=self.score(hidden[rows, last_token(attention_mask)]))


def backbone(m: Model, conf: Any, attention: str, seed: int, device: Any = "cpu") -> nn.Module:
    """The causal LM without its head (transformers' AutoModel), as halo.train.models.hf.build."""
    from transformers import AutoModel

    impl = hf.ATTN_IMPLEMENTATION[attention]
    torch.manual_seed(seed)
    try:
        if m.name_or_path is not None and str(device) != "meta":
            model = AutoModel.from_pretrained(
                m.name_or_path,
                config=conf,
                attn_implementation=impl,
                dtype=torch.float32,
                local_files_only=True,
            )
        else:
            with torch.device(device):
                model = AutoModel.from_config(conf, attn_implementation=impl, dtype=torch.float32)
    except Exception as exc:  # the config drives the constructor: what it raises is the input's
        where = m.name_or_path or "model.config"
        raise HaloError(f"{where}: cannot build the model ({hf._one_line(exc)})") from None
    if m.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def build_classifier(
    m: Model, conf: Any, attention: str, seed: int, device: Any = "cpu"
) -> nn.Module:
    body = backbone(m, conf, attention, seed, device)
    with torch.device(device):
        return Classifier(body, conf)


def configure(known: cd.Labels, tok: ChatTokenizer) -> Any:
    """The causal LM's config -> the ``*ForSequenceClassification`` config the export saves."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as NAMES,
    )

    def make(conf: Any) -> Any:
        out = copy.deepcopy(conf)
        if conf.model_type not in NAMES:
            raise HaloError(f"model: transformers has no sequence classifier for {conf.model_type}")
        out.architectures = [NAMES[conf.model_type]]
        out.id2label = dict(enumerate(known.names))
        out.label2id = {n: i for i, n in enumerate(known.names)}
        out.problem_type = "single_label_classification"
        if out.pad_token_id is None:  # transformers pools at the last token that is not this
            out.pad_token_id = tok.pad_id
        return out

    return make


def collate(items: list[cd.Item], pad_id: int) -> Batch:
    n = max(len(x.input_ids) for x in items)
    ids = torch.full((len(items), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), n), dtype=torch.long)
    for i, x in enumerate(items):
        ids[i, : len(x.input_ids)] = torch.tensor(x.input_ids)
        mask[i, : len(x.input_ids)] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.tensor([x.label for x in items]),
    }


def logits(model: nn.Module, b: Batch) -> torch.Tensor:
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.float()


def loss(model: nn.Module, b: Batch, prepared: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = logits(model, b)
    correct = (out.argmax(-1) == b["labels"]).float().sum()
    return functional.cross_entropy(out, b["labels"], reduction="sum"), {"accuracy": correct}


def scores(predicted: list[int], labels: list[int], n: int) -> dict[str, float]:
    """Accuracy and macro-F1 (the unweighted mean of the labels' F1; a label with neither a
    prediction nor an example scores 0, as scikit-learn's default)."""
    acc = sum(p == y for p, y in zip(predicted, labels, strict=True)) / max(len(labels), 1)
    f1s = []
    for k in range(n):
        tp = sum(p == k and y == k for p, y in zip(predicted, labels, strict=True))
        fp = sum(p == k and y != k for p, y in zip(predicted, labels, strict=True))
        fn = sum(p != k and y == k for p, y in zip(predicted, labels, strict=True))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return {"eval_accuracy": acc, "eval_macro_f1": sum(f1s) / n}


def predict(model: nn.Module, items: list[cd.Item], pad_id: int, batch: int = 32) -> list[int]:
    device = next(model.parameters()).device
    out: list[int] = []
    was = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(items), batch):
            b = {k: v.to(device) for k, v in collate(items[i : i + batch], pad_id).items()}
            out += logits(model, b).argmax(-1).tolist()
    model.train(was)
    return out


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    c = cfg.classification or Classification()
    train, evals = batching.load(cd.sources(cfg.data), cfg.training.seed, cd.parser(c))
    known = cd.labels(c, train)
    items = cd.encode(train, c, known, tok, cfg.data.max_seq_len)
    eval_items = cd.encode(evals, c, known, tok, cfg.data.max_seq_len)
    n = len(known.names)

    def eval_metrics(tr: Any, held: list[cd.Item]) -> dict[str, float]:
        return scores(predict(tr.model, held, tok.pad_id), [x.label for x in held], n)

    counts = [sum(x.label == k for x in items) for k in range(n)]
    notes = [
        f"classification: {len(items)} texts, {n} labels "
        + ", ".join(f"{name} ({k})" for name, k in zip(known.names, counts, strict=True)),
        *cd.describe(cfg, tok),
    ]
    if eval_items:
        notes.append(f"classification: {len(eval_items)} eval texts (accuracy and macro-F1)")
    return Method(
        name="classification",
        items=items,
        collate=lambda xs: collate(xs, tok.pad_id),
        loss=loss,
        count=lambda b: float(b["labels"].shape[0]),
        eval_items=eval_items,
        notes=notes,
        build_model=build_classifier,
        configure=configure(known, tok),
        eval_metrics=eval_metrics,
    )
