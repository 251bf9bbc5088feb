"""What every layer below the apps uses: one-line user errors and strict JSON files."""
