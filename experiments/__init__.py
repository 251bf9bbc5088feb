"""Studies: one module per figure or table; each is a Hydra multirun plus its aggregation."""
