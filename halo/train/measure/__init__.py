"""The trainer measured: what CI's bench and the GPU tiers gate on.

bench     tokens/s of `halo launch sft` against TRL's SFTTrainer, on the CPU
gpubench  tokens/s and MFU on GPUs (dense and MoE rows) against a plain PyTorch loop
numerics  attention kernels and trainer steps compared against fp32
"""
