"""What every layer below the apps uses: one-line user errors (errors.py), strict JSON and YAML
files (jsonfile.py, yamlfile.py) and config groups as checked frozen dataclasses (checks.py)."""
