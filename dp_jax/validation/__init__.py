"""Validation of the cost model: predictions against published measurements."""
