"""Realisation: walk an evaluated plan (halo.images.graph) in dependency order.

Fetch (the only network step), make bases, realise derivations, then build or assemble the
image. Everything that touches Docker, the store or the network is here or below; nothing
here computes a hash that evaluation computed (it takes them from the plan's nodes).
"""
