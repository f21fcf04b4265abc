"""Benchmark scripts: each prints its figures beside a peer measured in the same run."""
