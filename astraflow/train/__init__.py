"""Training: losses, the trainer loop."""
