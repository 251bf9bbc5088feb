"""Time-to-accuracy helpers: the bundled digits, steps to a target accuracy, the noise scale,
steps(B) fits."""
