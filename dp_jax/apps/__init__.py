"""The apps: thin Hydra entry points (compose, call the library, print the summary)."""
