"""python -m dp_jax.pipeline: the pipeline app (dp_jax/apps/pipeline.py)."""

from dp_jax.apps.pipeline import main

if __name__ == "__main__":
  main()
