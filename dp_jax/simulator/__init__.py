"""Simulator: a plan's iteration per device, background fill, metrics, Gantt (no JAX)."""
