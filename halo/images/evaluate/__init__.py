"""Evaluation: the build graph of an image for a platform, from the repository's files alone.

Nothing here asks Docker, the network or the store: `halo image plan NAME --platform P` is a
pure function of the checkout and P. Realisation (halo.images.realise) walks what this
computes and never calls back; the layering contracts in pyproject.toml keep both so.
"""
