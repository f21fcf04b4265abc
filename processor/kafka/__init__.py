"""Kafka as runstate uses it: client settings, topics, partitioning, reading topics back."""
