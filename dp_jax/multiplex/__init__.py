"""Multiplexing: the policy that packs background work into idle windows (policy.py, no JAX,
shared with the simulator) and the runtime's background jobs that follow it (JAX)."""
