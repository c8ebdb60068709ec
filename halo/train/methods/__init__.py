"""Training methods, registered by name (registry: `sft`, `preference/dpo`, ...).

Each method module exposes ``build(cfg, tokenizer) -> halo.train.state.Method`` (a loss over
the shared loop; online GRPO brings its own ``train``), and its ``*_data`` view module the
loss-mask lines of `halo launch --dry-run`, importable without torch.
"""
