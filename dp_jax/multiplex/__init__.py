"""Multiplexing (no JAX): the policy that packs background work into idle windows (policy.py,
shared by the simulator and the orchestrator's background jobs, dp_jax/orchestrator/) and the
background group as the apps name it (background.py: BackgroundConfig)."""
