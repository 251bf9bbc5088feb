"""The model zoo: Flax NNX models built from planner-visible layers (names and building:
dp_jax/models/zoo.py)."""
