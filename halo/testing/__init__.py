"""Test tiers, run inside an image (or natively) through one place that knows the flags."""
