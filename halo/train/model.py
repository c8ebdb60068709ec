"""A Llama/Qwen-style decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP) built from a dataclass."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from halo.errors import HaloError


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_json(self) -> str:
        return json.dumps({"architecture": "halo-decoder", **asdict(self)}, indent=2) + "\n"

    @classmethod
    def load(cls, path: Path) -> ModelConfig:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise HaloError(f"{path}: not a readable model config ({exc})") from exc
        known = {f.name for f in fields(cls)}
        if data.get("architecture") != "halo-decoder" or "vocab_size" not in data:
            raise HaloError(f"{path}: expected architecture 'halo-decoder' with a vocab_size")
        return cls(**{k: v for k, v in data.items() if k in known})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 even under bf16: the variance of small activations underflows.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
    freqs = torch.outer(torch.arange(cfg.max_seq_len).float(), inv)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, T, H, D); rotate the two halves of each head (the Llama/Qwen convention).
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, cfg.hidden_size, bias=False)
        # Set by the trainer from attention.select(); None means torch SDPA.
        self.flash: Callable | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd, nh, nkv = self.cfg.head_dim, self.cfg.num_heads, self.cfg.num_kv_heads
        q = apply_rope(self.q_proj(x).view(b, t, nh, hd), cos, sin)
        k = apply_rope(self.k_proj(x).view(b, t, nkv, hd), cos, sin)
        v = self.v_proj(x).view(b, t, nkv, hd)
        if self.flash is not None:
            out = self.flash(q, k, v, causal=True)
            # FA3/FA4 return (out, lse); FA2 returns out.
            out = out[0] if isinstance(out, tuple) else out
        else:
            # Sequences are right-padded, so the causal mask alone keeps real tokens clean.
            out = functional.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                enable_gqa=nkv != nh,
            ).transpose(1, 2)
        return self.o_proj(out.reshape(b, t, nh * hd))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_norm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.hidden_size % cfg.num_heads or cfg.num_heads % cfg.num_kv_heads:
            raise HaloError(
                "model: hidden_size must divide by num_heads, num_heads by num_kv_heads"
            )
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # Residual output projections are scaled down with depth (GPT-2 style).
                scale = (
                    (2 * self.cfg.num_layers) ** -0.5
                    if name.endswith(("o_proj.weight", "down_proj.weight"))
                    else 1.0
                )
                nn.init.normal_(p, mean=0.0, std=std * scale)
            else:
                nn.init.ones_(p)

    def set_attention(self, flash: Callable | None) -> None:
        for layer in self.layers:
            layer.attn.flash = flash

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        if t > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence length {t} exceeds model.max_seq_len {self.cfg.max_seq_len}"
            )
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target_t | prefix) per position, computed in fp32."""
    return -functional.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), reduction="none"
    ).view_as(targets)
