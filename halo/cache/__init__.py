"""The binary cache: derivation outputs shared through an OCI registry, compiled once per team."""
