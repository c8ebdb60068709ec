"""The sizes of the seeds' models, as their published config.json files give them.

A login node plans a run (`halo launch ... --dry-run`) before any weights or Hub files are
there. The plan reads the model's config.json from a local folder or the Hugging Face cache
first; for these Hub ids alone, when neither has it, it falls back on the fields below and
says so. Only what the plan reads is kept (sizes, counts, tying).
"""

from __future__ import annotations

from typing import Any

PUBLISHED: dict[str, dict[str, Any]] = {
    "openai/gpt-oss-20b": {
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 2880,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "vocab_size": 201088,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.9,
        "max_position_embeddings": 131072,
    },
    "openai/gpt-oss-120b": {
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "num_hidden_layers": 36,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 2880,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
        "vocab_size": 201088,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.9,
        "max_position_embeddings": 131072,
    },
    "Qwen/Qwen3-30B-A3B": {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.001,
        "max_position_embeddings": 40960,
    },
    "Qwen/Qwen3-4B": {
        "model_type": "qwen3",
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 9728,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
    },
}
