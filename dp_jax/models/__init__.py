"""The model zoo: Flax NNX models built from planner-visible layers."""

from dp_jax.models.base import GraphModel, LayerSpec, run_layers
from dp_jax.models.registry import MODEL_NAMES, build_model

__all__ = ["MODEL_NAMES", "GraphModel", "LayerSpec", "build_model", "run_layers"]
