"""Models: Hugging Face models as the trainer builds them, what it needs to know of an
architecture, and the mixture-of-experts block it trains Hugging Face MoE models with.

  hf            models through transformers: a pretrained folder, a cached Hub id, or a config
  model_config  the config's ``model.config`` checked by its transformers config class
  attention     which attention kernel to use, as a pure function of the device
  hfcache       the Hugging Face cache: where it is, and `halo hf-cache` filling it by hash
  arch          a config.json (as data, no torch) -> the sizes the mesh and the memory plan read
  source        where those sizes come from: model.config, config.json, the HF cache, known
  known         published configs of the seeds' models, for a host that has none of them
  grouped       the expert matmul: torch._grouped_mm, or a loop over experts (the reference)
  moe           Qwen3-MoE and gpt-oss blocks re-expressed over one dispatch/combine interface,
                with the load-balancing and z losses and the per-expert token counts
"""
