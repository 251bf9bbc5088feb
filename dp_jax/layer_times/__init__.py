"""Per-layer times (no JAX): the profile table, where profiles come from, the calibrated and
analytic GPU rooflines, DeepPool's imported A100 tables."""
