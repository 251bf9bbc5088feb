"""Measured here (JAX): layer times alone, in context and under load, stage boundaries, the local
links, plans timed interleaved, and the local measurement validate and the main job share."""
