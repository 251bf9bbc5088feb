"""python -m dp_jax.inspect: the inspect app (dp_jax/apps/inspect.py)."""

from dp_jax.apps.inspect import main

if __name__ == "__main__":
  main()
