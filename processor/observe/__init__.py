"""What a worker tells its operator: Prometheus metrics and logs."""
