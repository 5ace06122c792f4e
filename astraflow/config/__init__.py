"""The flow schema: what a flow YAML may say, checked before anything starts."""
