"""python -m dp_jax.accuracy: the accuracy app (dp_jax/apps/accuracy.py)."""

from dp_jax.apps.accuracy import main

if __name__ == "__main__":
  main()
