"""The planner on the zoo models: planner == simulator alone (samples only and with weight
sharding), no device change into elementwise."""

import functools
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dp_jax.base.checks import build
from dp_jax.hardware.cluster import named_cluster
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.layer_times.deeppool_import import import_deeppool_a100
from dp_jax.layer_times.sources import profile_batches
from dp_jax.layer_times.table import ProfileTable
from dp_jax.models import zoo
from dp_jax.models.zoo import MODEL_NAMES
from dp_jax.planner import make_plan
from dp_jax.planner.search import ELEMENTWISE_KINDS
from dp_jax.simulator.engine import simulate
from dp_jax.simulator.metrics import metrics

# The published LLM and MoE shapes fit no plan on these tests' 40 GB A100s at B = 32 without
# per-layer state sharding and recomputation (tests/test_app_defaults.py checks that refusal);
# their tiny twins run here, and their plans at scale are checked by tests/test_planner_uniform.py
# and the where_burst_pays study.
TOO_LARGE = ("deepseek_moe_16b", "llama3_70b", "llama3_8b", "llava_1_5_7b", "mixtral_8x7b")
ZOO = tuple(m for m in MODEL_NAMES if m not in TOO_LARGE)

CONF = Path(__file__).resolve().parents[1] / "conf" / "cluster"
FAST = ("resnet50", "inception_v3")  # fork/join blocks: the cases the rules are about
SETTINGS = [(g, a) for g in (8, 32) for a in (2.0, math.inf)]


@functools.cache
def cluster(name):
  return named_cluster(name)


@functools.cache
def graph(name, image_size=None):
  cfg = {"name": name} if image_size is None else {"name": name, "image_size": image_size}
  return build(zoo.ModelConfig, OmegaConf.create(cfg)).graph()


@functools.cache
def a100_profile(name):
  """The A100 tables where they cover the model, the analytic A100 model for the rest."""
  g = graph(name)
  analytic = analytic_profile(g, "A100-SXM4-40GB", "mixed fp16", profile_batches(32))
  try:
    table, _ = import_deeppool_a100(g)
  except Exception:  # no table for this model (ResNet-50's joins, GPT-2): analytic throughout
    return analytic
  return ProfileTable(model=g.model, device=table.device, dtype=table.dtype, source="imported",
                      layers={**analytic.layers, **table.layers})


def check_planner_equals_simulator(name, sharding=("samples",)):
  g, prof = graph(name), a100_profile(name)
  for num_devices, limit in SETTINGS:
    plan = make_plan(g, prof, cluster("dgx_a100"), num_devices=num_devices, global_batch=32,
                     amplification_limit=limit, sharding=sharding)
    m = metrics(simulate(g, prof, cluster("dgx_a100"), plan))
    p = plan.predicted
    assert m["alone_iteration_ms"] == pytest.approx(p["iteration_ms"], rel=1e-3), (num_devices,
                                                                                   limit)
    assert m["gpu_ms"] == pytest.approx(p["gpu_ms"], rel=1e-3), (num_devices, limit)
    assert p["idle_fraction"] >= -1e-12 and m["alone_idle_fraction"] >= -1e-9


@pytest.mark.parametrize("name", FAST)
def test_planner_equals_simulator_alone(name):
  check_planner_equals_simulator(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_planner_equals_simulator_alone_on_every_zoo_model(name):
  check_planner_equals_simulator(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_planner_equals_simulator_alone_with_weight_sharding(name):
  check_planner_equals_simulator(name, ("samples", "weights"))


def changes_into_elementwise(g, plan):
  """Elementwise layers placed on other devices than the layer that feeds them."""
  where = {lp.name: lp.devices for lp in plan.layers}
  return [n.name for n in g.nodes
          if n.kind in ELEMENTWISE_KINDS and n.inputs and where[n.name] != where[n.inputs[0]]]


def check_no_change_into_elementwise(name, image_size=None):
  g = graph(name, image_size)
  cases = [(cluster("local_cpu"), analytic_profile(g, "cpu", "float32", profile_batches(32)), 8),
           (cluster("dgx_a100"),
            analytic_profile(g, "A100-SXM4-40GB", "mixed fp16", profile_batches(32)), 32)]
  for cl, prof, num_devices in cases:
    for limit in (2.0, math.inf):
      plan = make_plan(g, prof, cl, num_devices=num_devices, global_batch=32,
                       amplification_limit=limit, check_memory=False)
      assert changes_into_elementwise(g, plan) == [], (cl.name, limit)


def test_vgg16_at_32x32_keeps_relu_on_the_conv_devices():
  # The CPU roofline prices ReLU as memory-bound; before the rule this plan alternated
  # convolutions on 8 devices with ReLUs on 2.
  check_no_change_into_elementwise("vgg16", 32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_no_plan_changes_device_count_into_an_elementwise_layer(name):
  check_no_change_into_elementwise(name)
