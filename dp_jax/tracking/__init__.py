"""Tracking and output: W&B runs with provenance, run folders, sweep summaries, sweeps read back."""
