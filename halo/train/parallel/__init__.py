"""Parallelism on one DeviceMesh (dp_replicate, dp_shard, cp, tp, ep) through PyTorch's own
APIs: FSDP2 ``fully_shard``, DTensor ``parallelize_module``, ``context_parallel``, and
torch.distributed.checkpoint.

  distributed  the process group, DDP wrapping, full state dicts (one process: no group)
  dims         the mesh's sizes from the config and the world, checked (no torch)
  support      which mesh dimensions each method trains with (no torch)
  plan         the memory plan a dry run prints, from the config alone (no torch)
  mesh         the DeviceMesh and the groups cut from it
  ep           expert parallelism: one dispatch/combine interface, all-to-all and DeepEP backends
  tp           the tensor-parallel plan of a transformers decoder
  cp           context parallelism: sequence shards and ring attention
  build        a model placed on the mesh: MoE blocks, TP, EP, FSDP2, weights from rank 0
  norms        gradient-norm clipping over parameters on several meshes
  dcp          sharded checkpoints: save, load under another mesh, consolidate to safetensors
"""
