"""Orchestrator (JAX): background jobs on the devices a plan leaves idle, following the
multiplexing policy, and the training jobs of the apps (in process or on pinned processes)."""
