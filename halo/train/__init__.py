"""The bundled trainer: `halo launch METHOD CONFIG` (SFT, offline GRPO) on a tiny, readable core.

Layout, one job per module:
  config      YAML -> validated dataclasses (every problem at once, with key paths)
  overrides   `--training.max_steps=3` style flags -> config edits
  registry    method names -> the module that implements them
  launcher    (method, config, nproc) -> the exact command (python / torchrun / accelerate)
  preflight   paths, writability, base model, devices, disk
  model       a Llama/Qwen-style decoder built from a dataclass
  tokenizer   byte-level tokenizer with special tokens and a ChatML template
  attention   which attention kernel to use, as a pure function
  data        JSONL -> tokenized examples; deterministic, rank-sharded batch order
  checkpoint  atomic, complete-or-absent checkpoints; find newest; prune
  distributed process group, DDP/FSDP2 wrapping (the only place that talks to torch.distributed)
  loop        the training loop shared by all methods
  run         the process entry point the launcher starts
  bench       tokens/s of our loop against a plain PyTorch loop
  gpubench    tokens/s and MFU on one GPU, ~1B Llama, against a plain PyTorch loop
  numerics    attention kernels and trainer steps compared against fp32 (the GPU tiers' checks)
"""
