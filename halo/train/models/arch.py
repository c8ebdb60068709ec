"""An architecture's sizes, read from a Hugging Face config as plain data (no torch).

The mesh checks (heads divisible by tp, experts by ep) and the memory plan run on a login node
that may have neither torch nor the weights: they read ``config.json`` (or ``model.config``)
as a mapping. Parameter counts follow the layouts transformers builds for the causal LMs the
trainer knows (Llama/Qwen-style dense blocks, Qwen3-MoE and gpt-oss expert blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Model types whose MoE block halo.train.models.moe re-expresses (expert parallelism, the
# grouped matmul, the routing losses). Other MoE types train as transformers writes them.
MOE_TYPES = ("qwen3_moe", "gpt_oss")


def _int(conf: dict[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = conf.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


@dataclass(frozen=True)
class Arch:
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    # Layers whose MLP is the expert block (the others are dense).
    moe_layers: int = 0
    attention_bias: bool = False
    router_aux_loss_coef: float = 0.0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and self.moe_layers > 0

    def attention_params(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        n = self.hidden * (q + 2 * kv) + q * self.hidden
        if self.attention_bias:
            n += q + 2 * kv + self.hidden
        if self.model_type in ("qwen3", "qwen3_moe"):
            n += 2 * self.head_dim  # q_norm, k_norm
        if self.model_type == "gpt_oss":
            n += self.heads  # attention sinks
        return n

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    def expert_params(self) -> int:
        """One expert's weights (gate, up, down; gpt-oss adds their biases)."""
        n = 3 * self.hidden * self.moe_intermediate
        if self.model_type == "gpt_oss":
            n += 2 * self.moe_intermediate + self.hidden
        return n

    def router_params(self) -> int:
        return self.experts * self.hidden + (self.experts if self.model_type == "gpt_oss" else 0)

    def counts(self) -> dict[str, int]:
        """Parameters by kind: embeddings (with an untied head), attention (with norms), dense
        MLPs, routers and experts; what the memory plan shards by different mesh dims."""
        norms = self.layers * 2 * self.hidden + self.hidden
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        dense_layers = self.layers - self.moe_layers
        return {
            "embeddings": embed,
            "attention": self.layers * self.attention_params() + norms,
            "mlp": dense_layers * self.dense_mlp_params(),
            "router": self.moe_layers * self.router_params(),
            "experts": self.moe_layers * self.experts * self.expert_params(),
        }

    def total_params(self) -> int:
        return sum(self.counts().values())

    def active_params(self) -> int:
        """Parameters one token's matmuls use (top-k of the experts; the LM head, not the
        embedding lookup): 6 x this is a token's training FLOPs, the MFU count."""
        c = self.counts()
        per_token = self.moe_layers * self.top_k * self.expert_params()
        head = self.vocab * self.hidden
        return head + c["attention"] + c["mlp"] + c["router"] + per_token


def from_config(conf: dict[str, Any]) -> Arch:
    """The sizes of a config.json mapping (missing fields: transformers' usual defaults)."""
    model_type = str(conf.get("model_type", ""))
    hidden = _int(conf, "hidden_size", "n_embd", "d_model")
    heads = _int(conf, "num_attention_heads", "n_head")
    head_dim = _int(conf, "head_dim") or (hidden // heads if heads else 0)
    layers = _int(conf, "num_hidden_layers", "n_layer")
    experts = _int(conf, "num_experts", "num_local_experts", "n_routed_experts")
    moe_layers = 0
    if experts:
        step = _int(conf, "decoder_sparse_step", default=1) or 1
        dense = set(conf.get("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    intermediate = _int(conf, "intermediate_size", "n_inner", "ffn_dim")
    moe_intermediate = _int(conf, "moe_intermediate_size") or (intermediate if experts else 0)
    coef = conf.get("router_aux_loss_coef", 0.0)
    return Arch(
        model_type=model_type,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=_int(conf, "num_key_value_heads", default=heads),
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=_int(conf, "vocab_size"),
        tied=bool(conf.get("tie_word_embeddings", False)),
        experts=experts,
        top_k=_int(conf, "num_experts_per_tok", "experts_per_token", "moe_topk"),
        moe_intermediate=moe_intermediate,
        moe_layers=moe_layers,
        attention_bias=bool(conf.get("attention_bias", False)),
        router_aux_loss_coef=float(coef) if isinstance(coef, int | float) else 0.0,
    )
