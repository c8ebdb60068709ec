"""From `halo launch` to processes; nothing here trains (a login node runs it without torch).

launcher   (method, config, nproc) -> the exact command: python, torchrun or accelerate
slurm      `halo launch --slurm`: the sbatch script and its submission
supervise  a multi-process launcher as a child, signals relayed to the workers
fabric     NCCL's network for a run: its environment, and a check that it is there
preflight  paths, writability, base model, devices, disk: every problem at once
driver     the minimum NVIDIA driver the images need, from nvidia-smi
"""
