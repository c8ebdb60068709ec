"""Halo: an LLM post-training stack and the toolchain that builds, tests and ships its images."""

__version__ = "0.1.0"
