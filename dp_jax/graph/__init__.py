"""Models as graphs of planner-visible layers (no JAX): the LayerGraph and its series-parallel
decomposition (layer_graph.py). The tracer that makes one from a model is dp_jax/models/trace.py."""
