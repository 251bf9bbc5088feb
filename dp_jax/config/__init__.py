"""Configuration: the config groups' schemas, their checks, config files, and the Hydra edge every
app goes through (YAML -> the checked config; the typed options are built from it there)."""
