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


NAN_MODEL = '''
import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import GraphModel


class Nan(nnx.Module):
  def __call__(self, x):
    return x * jnp.nan


class NanMLP(GraphModel):
  num_classes = 4

  def __init__(self, *, dtype=jnp.float32, rngs):
    self.config = {}
    self.layers = nnx.List([nnx.Linear(8, 4, rngs=rngs), Nan()])

  def input_spec(self, batch):
    return jax.ShapeDtypeStruct((batch, 8), jnp.float32)

  def label_spec(self, batch):
    return jax.ShapeDtypeStruct((batch,), jnp.int32)
'''


def test_a_loss_that_is_nan_from_the_first_step_stops_the_run_in_one_line(tmp_path):
  """Issue 41, item 5: one policy for a non-finite loss (the background job's: a failure under
  background.on_failure, tests/test_probe_background.py)."""
  import json

  from apps import REPO, assert_one_line_error, run_app

  (tmp_path / "probe_nan_model.py").write_text(NAN_MODEL)
  (tmp_path / "nan_mlp.yaml").write_text("_target_: probe_nan_model.NanMLP\nname: nan_mlp\n")
  result = run_app("train", "model=nan_mlp.yaml", "runtime.num_devices=2", "batch_size=4",
                   "steps=3", "runtime.checkpoint_every=1", "logger=disabled", cwd=tmp_path,
                   env={"PYTHONPATH": f"{REPO}:{tmp_path}"})
  assert_one_line_error(result, "loss is nan at step 1: training stopped (last good checkpoint: "
                                "none)")
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert status["status"] == "failed" and "loss is nan" in status["error"]
  assert not (tmp_path / "run" / "checkpoints").exists() or not any(
      p.name.isdigit() for p in (tmp_path / "run" / "checkpoints").iterdir())
