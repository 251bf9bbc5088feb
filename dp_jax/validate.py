"""python -m dp_jax.validate: the validate app (dp_jax/apps/validate.py)."""

from dp_jax.apps.validate import main

if __name__ == "__main__":
  main()
