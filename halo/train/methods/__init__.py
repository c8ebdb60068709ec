"""Training methods; each module exposes build(cfg, tokenizer) -> halo.train.loop.Method."""
