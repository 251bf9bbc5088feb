"""The main job's parts (python -m dp_jax.pipeline): the paper's A100 setting and the summary."""
