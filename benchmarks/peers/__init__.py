"""Benchmark peers: programs that drain a proposals topic the way another design would.
They are benchmark code, not product code; each runs until SIGTERM."""
