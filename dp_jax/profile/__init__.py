"""Per-layer costs: measured on this backend, analytic device models, imported A100 tables."""
