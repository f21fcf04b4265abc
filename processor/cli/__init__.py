"""The `runstate` command."""
