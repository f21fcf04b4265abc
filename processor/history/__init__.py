"""Runs over time: verify, replay, rebuild, machine versions and their diffs, resume and
continue."""
