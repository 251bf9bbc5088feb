"""python -m dp_jax.simulate: the simulate app (dp_jax/apps/simulate.py)."""

from dp_jax.apps.simulate import main

if __name__ == "__main__":
  main()
