"""The bundled trainer: `halo launch METHOD CONFIG` on a small, readable core.

One folder per concern; a folder imports only those below it (the contracts of
[tool.importlinter] in pyproject.toml say who may import whom):

  cli.py        `halo launch | preflight | export | hf-cache | plot` (a login node: no torch)
  run.py        one training process, top to bottom: config -> build -> train -> close
                (`python -m halo.train.run`, what the launcher starts once or once per rank)
  config.py     the run config: YAML -> validated models, every problem at once
  overrides.py  `--training.max_steps=3` style flags -> config edits
  state.py      the shapes every part shares: a Method, the Trainer, a step's stats
  rewards.py    reward functions a config names (`rollout.reward: package.module:function`)

  launch/       from a command line to processes: the command, sbatch, torchrun supervised,
                NCCL's fabric, preflight checks, the driver; nothing of it trains
  methods/      the training methods by name (registry), each a loss over the shared loop
  loop/         the loop every method shares: setup, one step, saving, stopping, the optimizer
  models/       Hugging Face models, attention kernels, MoE blocks, sizes read as data
  parallel/     one DeviceMesh: process groups, FSDP2, TP, CP, EP, sharded checkpoints
  data/         files and s3:// in, tokenized examples and batches out (tokenizer, formats)
  checkpoints/  what a run leaves on disk: verified checkpoints, the job lock, HF export
  observe/      what a run shows of itself: trackers, profiler traces, plots
  measure/      the trainer measured: throughput benchmarks, numerics against fp32
"""
