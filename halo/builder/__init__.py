"""Derivation builders: the locked toolchain, the native (network-less) and Docker builds, records."""
