"""Models: what the trainer needs to know of an architecture, and the mixture-of-experts
block it trains Hugging Face MoE models with.

  arch     a config.json (as data, no torch) -> the sizes the mesh and the memory plan read
  grouped  the expert matmul: torch._grouped_mm, or a loop over experts (the reference)
  moe      Qwen3-MoE and gpt-oss blocks re-expressed over one dispatch/combine interface,
           with the load-balancing and z losses and the per-expert token counts
"""
