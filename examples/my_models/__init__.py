"""A user's own models for dp_jax, outside the package: a ViT and an MLP-Mixer (Flax NNX).

Put the folder holding `my_models` on PYTHONPATH and point `model=` at a config of one
(examples/conf/model/*.yaml, or any YAML with a `_target_`); see docs/extending.md.
"""
