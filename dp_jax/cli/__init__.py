"""The command-line edge of every app: Hydra apps, config files, the composed config checked."""
