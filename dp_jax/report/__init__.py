"""Reporting: comparisons with margins and verdicts, a plan presented (no JAX)."""
