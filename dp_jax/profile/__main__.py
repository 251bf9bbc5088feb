"""python -m dp_jax.profile: the profile app (dp_jax/apps/profile.py)."""

from dp_jax.apps.profile import main

if __name__ == "__main__":
  main()
