"""The training loop every method shares, and what one training process stands on.

setup      a validated config -> a ready Trainer: tokenizer, models, mesh, optimizer
loop       one optimizer step, evaluation, metrics, checkpoints: `train` strings them
saving     a Trainer to a checkpoint, and the checkpoint to resume from
optimizer  AdamW and the learning-rate schedule
stopping   SIGTERM/SIGINT: finish the batch, save once, exit 0
"""
