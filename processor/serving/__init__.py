"""Serving reads: a worker's HTTP API, the run inspector, read fences, queries across peers."""
