"""python -m dp_jax.plan: the plan app (dp_jax/apps/plan.py)."""

from dp_jax.apps.plan import main

if __name__ == "__main__":
  main()
