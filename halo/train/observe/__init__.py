"""What a run shows of itself; metrics.jsonl (written by the loop) stays the record of truth.

trackers   every metrics row also to W&B and/or TensorBoard, never stopping training
profiling  torch.profiler traces around a window of steps
plot       `halo plot`: a run's curves as one PNG
"""
