"""dp_jax: burst-parallel training and GPU multiplexing (DeepPool) as a JAX experiment framework."""

__version__ = "0.1.0"
