"""Training: optimizer, mesh and sharding, the pure train step, checkpoints, the loop."""
