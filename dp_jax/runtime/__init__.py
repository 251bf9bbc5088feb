"""Burst-parallel runtime: per-stage jitted programs on sub-meshes, device_put between stages."""
