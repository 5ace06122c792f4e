"""Rollout: engines and the stateless worker loop."""
