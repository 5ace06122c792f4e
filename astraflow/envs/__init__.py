"""Workloads: task sampling, rewards, held-out evaluation sets."""
