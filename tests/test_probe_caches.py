"""Probe rows of issue 41 on caches: an edit of a user's model, or of a helper module it
imports, is traced again (the graph cache is keyed by the model's source); a profile entry is
keyed by the layer's traced content; a calibration by the code and flags it was measured with."""

import json

from apps import run_app

from dp_jax.graph.layer_graph import LayerNode
from dp_jax.measurement import cache
from dp_jax.models import zoo

MODEL = '''
import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import GraphModel
from umods import helpers


class Flat(nnx.Module):
  def __call__(self, x):
    return x.reshape(x.shape[0], -1)


class MLP(GraphModel):
  def __init__(self, *, hidden: int = helpers.WIDTH, dtype=jnp.float32, rngs):
    self.config = {"hidden": hidden}
    self.layers = nnx.List([Flat(), nnx.Linear(8, hidden, rngs=rngs),
                            nnx.Linear(hidden, 4, rngs=rngs)])

  def input_spec(self, batch):
    return jax.ShapeDtypeStruct((batch, 8), jnp.float32)

  def label_spec(self, batch):
    return jax.ShapeDtypeStruct((batch,), jnp.int32)
'''


def user_package(root, width=16):
  (root / "umods").mkdir(parents=True, exist_ok=True)
  (root / "umods" / "__init__.py").write_text("")
  (root / "umods" / "helpers.py").write_text(f"WIDTH = {width}\n")
  (root / "umods" / "mlp.py").write_text(MODEL)
  (root / "mlp.yaml").write_text("_target_: umods.mlp.MLP\nname: user_mlp\n")
  return root


def param_bytes(run_dir):
  graph = json.loads((run_dir / "graph.json").read_text())
  return sum(n["param_bytes"] for n in graph["nodes"])


def test_editing_a_helper_module_the_model_imports_retraces_it(tmp_path):
  root = user_package(tmp_path)
  env = {"PYTHONPATH": f"{zoo.Path(__file__).resolve().parents[1]}:{root}",
         "DP_JAX_GRAPH_CACHE": str(tmp_path / "graphs")}
  first = run_app("inspect", "model=mlp.yaml", "logger=disabled", cwd=root, env=env)
  assert first.returncode == 0, first.stderr
  assert param_bytes(root / "run") == 4 * (8 * 16 + 16 + 16 * 4 + 4)
  (root / "umods" / "helpers.py").write_text("WIDTH = 64\n")  # the model file is unchanged
  second = run_app("inspect", "model=mlp.yaml", "logger=disabled", cwd=root, env=env)
  assert second.returncode == 0, second.stderr
  assert param_bytes(root / "run") == 4 * (8 * 64 + 64 + 64 * 4 + 4)
  assert len(list((tmp_path / "graphs").glob("user_mlp-*.json"))) == 2


def test_the_source_digest_follows_imports_but_not_installed_packages(tmp_path, monkeypatch):
  root = user_package(tmp_path)
  monkeypatch.syspath_prepend(str(root))
  files = dict(zoo.model_sources("umods.mlp.MLP"))
  assert set(files) == {"umods", "umods.helpers", "umods.mlp"}  # not jax, flax or dp_jax
  before = zoo.source_digest("umods.mlp.MLP")
  (root / "umods" / "helpers.py").write_text("WIDTH = 17\n")
  assert zoo.source_digest("umods.mlp.MLP") != before
  assert zoo.source_digest("umods.missing.MLP") is None  # not found: never cached
  assert zoo.model_sources("dp_jax.models.vgg.VGG16") == []  # the package's own code


def test_a_profile_entry_is_keyed_by_the_layers_traced_content():
  node = LayerNode(name="fc", kind="linear", params=80, param_bytes=320, out_shape=(16,),
                   flops_per_sample=256.0, attrs={"in_features": 4, "out_features": 16})
  wider = LayerNode(**{**node.__dict__, "params": 160, "param_bytes": 640,
                       "flops_per_sample": 512.0})
  renamed = LayerNode(**{**node.__dict__, "name": "head", "inputs": ("x",)})
  assert cache.layer_hash(node) != cache.layer_hash(wider)  # same attrs, other code
  assert cache.layer_hash(node) == cache.layer_hash(renamed)  # equal layers share timings


def test_a_calibration_is_keyed_by_the_flags_and_code_it_was_measured_with(tmp_path,
                                                                           monkeypatch):
  from dp_jax.measurement import local_links

  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  path = local_links.cache_path(tmp_path, 2)
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_cpu_foo")
  assert local_links.cache_path(tmp_path, 2) != path
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # in the key anyway
  assert local_links.cache_path(tmp_path, 2) == path
  key = local_links.cache_key(2)
  assert key["num_devices"] == 2 and len(key["code"]) == 16 and key["jaxlib"]
