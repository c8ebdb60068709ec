"""Rollout servers (vLLM, SGLang): the server table and health probe, a CPU server as a
process on this host, the tiny model it serves in tests, and the client online GRPO uses."""
