"""Per-layer costs: measured on this backend (alone, in context, under load), the calibrated and
analytic GPU rooflines, DeepPool's imported A100 tables; the local links calibrated."""
