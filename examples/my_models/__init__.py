"""A user's own models for dp_jax, outside the package (Flax NNX): a ViT, an MLP-Mixer and a
small language model (lm.py: its own layer_specs, input_spec and label_spec).

Put the folder holding `my_models` on PYTHONPATH and point `model=` at a config of one
(examples/conf/model/*.yaml, or any YAML with a `_target_`); see docs/extending.md.
"""
