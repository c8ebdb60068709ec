"""Text embeddings by contrastive training: InfoNCE over in-batch and hard negatives.

The model is the LM's backbone (transformers' ``AutoModel``, the causal LM without its head);
a text's embedding is its last hidden states pooled (``mean`` over its tokens, or the
``last`` token's) and L2-normalised. For a query q_i of the global batch, the candidates are
every positive of the batch and every hard negative, and the loss is the cross-entropy of its
own positive among them at ``temperature`` (sentence-transformers'
MultipleNegativesRankingLoss; the E5 and GTE recipes)::

    loss_i = -log( exp(q_i.p_i / t) / sum_c exp(q_i.c / t) )

averaged over the global batch. Under data parallelism every process embeds its share and the
positives and negatives of all processes are gathered with their gradients
(torch.distributed.nn's all_gather), so the negatives grow with the batch, not with one
process's share, and N processes compute exactly the loss of one process on the whole batch.
The eval set reports recall@1 and recall@10: how often a held-out query's own positive is the
nearest, or among the ten nearest, of all held-out positives.

Rows: halo.train.methods.embedding_data (no torch there). ``halo export`` writes the backbone
(``*Model``), which transformers' AutoModel loads; pooling its last hidden state as configured
gives the trainer's vectors.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

from halo.errors import HaloError
from halo.train.config import Config, Embedding
from halo.train.data import batching
from halo.train.data.tokenizer import ChatTokenizer
from halo.train.methods import classification
from halo.train.methods import embedding_data as ed
from halo.train.state import Batch, Method


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """One vector per row of last hidden states (fp32): their mean over the row's tokens, or
    the last token's."""
    hidden = hidden.float()
    if how == "mean":
        m = mask.unsqueeze(-1).float()
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, classification.last_token(mask)]


def embed(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """L2-normalised pooled vectors (cosine similarity is then a dot product)."""
    out = model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    return functional.normalize(pool(out, mask, how), dim=-1)


def _pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def collate(items: list[ed.Item], pad_id: int) -> Batch:
    """Queries, then positives, then each row's hard negatives: one forward for all."""
    texts = [x.query for x in items] + [x.positive for x in items]
    texts += [n for x in items for n in x.negatives]
    ids, mask = _pad(texts, pad_id)
    return {"input_ids": ids, "attention_mask": mask, "queries": torch.ones(len(items))}


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gathered(x: torch.Tensor) -> torch.Tensor:
    """``x`` of every process, in rank order, with gradients flowing back to each one's own."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(x), dim=0)


def info_nce(
    queries: torch.Tensor, candidates: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Per query: -log softmax of its target among the candidates at ``temperature``."""
    scores = queries @ candidates.T / temperature
    return functional.cross_entropy(scores, targets, reduction="none")


def make_loss(e: Embedding) -> Any:
    def loss(
        model: nn.Module, b: Batch, prepared: Any
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = b["queries"].shape[0]
        vectors = embed(model, b["input_ids"], b["attention_mask"], e.pooling)
        q, p, negatives = vectors[:n], vectors[n : 2 * n], vectors[2 * n :]
        candidates = torch.cat([gathered(p), gathered(negatives)])
        # This process's positives are its rank's block of the gathered ones (equal shares).
        targets = torch.arange(n, device=q.device) + rank() * n
        losses = info_nce(q, candidates, targets, e.temperature)
        hits = ((q @ candidates.T).argmax(-1) == targets).float().sum()
        return losses.sum(), {"batch_recall_at_1": hits.detach()}

    return loss


def recall(model: nn.Module, items: list[ed.Item], pad_id: int, how: str) -> dict[str, float]:
    """recall@1 and @10 of the held-out queries among all held-out positives."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    with torch.no_grad():
        vecs = []
        for texts in ([x.query for x in items], [x.positive for x in items]):
            parts = []
            for i in range(0, len(texts), 32):
                ids, mask = _pad(texts[i : i + 32], pad_id)
                parts.append(embed(model, ids.to(device), mask.to(device), how))
            vecs.append(torch.cat(parts))
    model.train(was)
    scores = vecs[0] @ vecs[1].T
    own = scores.diagonal().unsqueeze(-1)
    rank = (scores > own).sum(-1)  # how many positives score above the query's own
    return {
        "eval_recall_at_1": float((rank < 1).float().mean()),
        "eval_recall_at_10": float((rank < 10).float().mean()),
    }


def configure(conf: Any) -> Any:
    """The causal LM's config -> its backbone's (``*Model``), what the export saves."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    if conf.model_type not in MODEL_MAPPING_NAMES:
        raise HaloError(f"model: transformers has no base model class for {conf.model_type}")
    out = copy.deepcopy(conf)
    out.architectures = [MODEL_MAPPING_NAMES[conf.model_type]]
    return out


def build(cfg: Config, tok: ChatTokenizer) -> Method:
    e = cfg.embedding or Embedding()
    train, evals = batching.load(ed.sources(cfg.data), cfg.training.seed, ed.parser(e))
    k = ed.hard_negatives(e, train)
    items = ed.encode(train, k, tok, cfg.data.max_seq_len)
    eval_items = ed.encode(evals, 0, tok, cfg.data.max_seq_len)
    notes = [
        f"embedding: {len(items)} pairs, {k} hard negatives each, {e.pooling} pooling, "
        f"temperature {e.temperature}; in-batch negatives gathered over all processes",
        *ed.describe(cfg, tok),
    ]
    if eval_items:
        notes.append(f"embedding: {len(eval_items)} held-out pairs (recall@1, recall@10)")
    return Method(
        name="embedding",
        items=items,
        collate=lambda xs: collate(xs, tok.pad_id),
        loss=make_loss(e),
        count=lambda b: float(b["queries"].shape[0]),
        eval_items=eval_items,
        notes=notes,
        build_model=classification.backbone,
        configure=configure,
        eval_metrics=lambda tr, held: recall(tr.model, held, tok.pad_id, e.pooling),
    )
