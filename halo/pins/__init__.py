"""Pin sets: inputs in pins/<set>.toml, resolved into pins/<set>.lock."""
