"""python -m dp_jax.train: the train app (dp_jax/apps/train.py)."""

from dp_jax.apps.train import main

if __name__ == "__main__":
  main()
