"""The content-addressed store: artifacts kept under their sha256, fetched and verified."""
