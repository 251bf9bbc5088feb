"""Probe rows of issue 41 on a user's model (in process): each error names the option or the
method, the class, and what it needs, instead of a message from deep inside JAX or flax."""

import pytest

from dp_jax.base.errors import UserError
from dp_jax.models.zoo import ModelConfig

MODELS = '''
import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import GraphModel


class MLP(GraphModel):
  def __init__(self, *, hidden: int = 16, scale: float | None = None, dtype=jnp.float32, rngs):
    self.config = {}
    self.layers = nnx.List([nnx.Linear(8, hidden, rngs=rngs)])

  def input_spec(self, batch):
    return jax.ShapeDtypeStruct((batch, 8), jnp.float32)

  def label_spec(self, batch):
    return jax.ShapeDtypeStruct((batch,), jnp.int32)


class Untyped(MLP):
  def __init__(self, *, hidden=16, dtype=jnp.float32, rngs):
    super().__init__(hidden=hidden, rngs=rngs)


class NoInput(GraphModel):
  def __init__(self, *, dtype=jnp.float32, rngs):
    self.config = {}
    self.layers = nnx.List([nnx.Linear(8, 4, rngs=rngs)])


class BadInput(MLP):
  def input_spec(self, batch):
    return (batch, 8)


def as_dict(*, dtype=jnp.float32, rngs):
  return {"name": "not a model"}
'''


@pytest.fixture
def user_models(tmp_path, monkeypatch):
  (tmp_path / "probe_user_models.py").write_text(MODELS)
  monkeypatch.syspath_prepend(str(tmp_path))
  return "probe_user_models"


def build(module, cls, **kwargs):
  return ModelConfig.of(f"{module}.{cls}", cls.lower(), kwargs).build(abstract=True)


@pytest.mark.parametrize("cls, kwargs, said", [
    ("MLP", {"hidden": "abc"},
     "model.kwargs.hidden='abc' for model mlp: probe_user_models.MLP takes hidden as int, not "
     "str"),
    ("MLP", {"hidden": 2.5}, "takes hidden as int, not float"),
    ("MLP", {"scale": "x"}, "takes scale as float or None, not str"),
    ("Untyped", {"hidden": "abc"},
     "model untyped: probe_user_models.Untyped(model.kwargs.hidden='abc') failed: TypeError: "),
    ("NoInput", {}, "model noinput: probe_user_models.NoInput does not define input_spec(batch): "
                    "a jax.ShapeDtypeStruct of a batch of inputs"),
    ("BadInput", {}, "probe_user_models.BadInput.input_spec returned (1, 8); it must be "
                     "input_spec(batch): a jax.ShapeDtypeStruct"),
    ("as_dict", {}, "model as_dict: probe_user_models.as_dict returned a dict, not a "
                    "dp_jax.models.GraphModel"),
])
def test_a_user_model_error_names_the_option_or_method_and_the_class(user_models, cls, kwargs,
                                                                     said):
  with pytest.raises(UserError) as e:
    build(user_models, cls, **kwargs)
  assert said in str(e.value) and "\n" not in str(e.value)


def test_options_of_the_annotated_types_build(user_models):
  assert build(user_models, "MLP", hidden=4, scale=2).layer_specs()[0].name == "layers.0"
  assert build(user_models, "MLP", scale=None) is not None
