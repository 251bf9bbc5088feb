"""Models as graphs of planner-visible layers: the LayerGraph (no JAX) and the tracer (JAX)."""
