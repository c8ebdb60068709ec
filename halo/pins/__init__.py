"""Pin sets: inputs in pins/sets.toml, resolved into PEP 751 locks, pins/pylock.<set>.toml."""
