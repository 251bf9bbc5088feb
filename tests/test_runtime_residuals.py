"""What a non-last stage keeps for its backward: every residual that grows with the batch is
split over the stage's "data" axis (at most 1/d of its global bytes on a device), for stages
split by samples and for weight-split layers; jax.nn.relu's zeros and the causal mask of
jax.nn.dot_product_attention were whole-batch copies on every device."""

import jax
import pytest
from flax import nnx
from runtime_helpers import TINY_GPT2, batches, make_model, sgd

from dp_jax.models import gpt2
from dp_jax.planner.contract import check_plan, layout_plan
from dp_jax.runtime import transfer
from dp_jax.runtime.functional import split_layers
from dp_jax.runtime.residuals import stage_residuals
from dp_jax.runtime.stages import INPUT, structure_graph
from dp_jax.runtime.step import build_program, init_state

BATCH = 8


def small(name: str):
  """The runtime tests' model; GPT-2 with one block, to keep the test short."""
  return gpt2.GPT2(**{**TINY_GPT2, "n_layer": 1}, rngs=nnx.Rngs(0)) if name == "gpt2" else (
      make_model(name))


def residuals(name: str, devices: range, shardings=None, layer: str | None = None):
  """Residuals of the stage running `layer` on `devices`, the others on two other devices
  (default: every layer but the last on `devices`, so that stage is not the fused last one);
  the stages before it run their forward first to give it its inputs."""
  model = small(name)
  graph = structure_graph(model, name)
  mine = (lambda n: n == layer) if layer else (lambda n: n != graph.names[-1])
  others = range(devices.stop, devices.stop + 2) if devices.stop < 8 else range(2)
  plan = layout_plan(graph, lambda n: devices if mine(n) else others, global_batch=BATCH,
                     num_devices=8, shardings=shardings)
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, check_plan(plan, graph, available_devices=8), sgd(),
                          jax.devices())
  state = init_state(program, params, stats, sgd())
  x, _ = batches(model, BATCH, 1)[0]
  acts = {}
  for sp in program.stages:
    p = {n: state["params"][n] for n in sp.stage.layers}
    st = {n: state["stats"][n] for n in sp.stage.layers}
    ins = transfer.move({i: acts[i] for i in sp.stage.inputs if i != INPUT}, sp.batch)
    x_in = jax.device_put(x, sp.batch) if INPUT in sp.stage.inputs else None
    if mine(sp.stage.layers[0]):
      return stage_residuals(sp, p, st, {}, ins, x_in)[1]
    acts.update(sp.fwd(p, st, {}, ins, x_in)[0])
  raise AssertionError("no stage ran the layer")


def _unsplit(rows, d):
  return [r for r in rows if r.per_sample and r.device_bytes > r.global_bytes / d]


@pytest.mark.parametrize("name", ["digits_cnn", "gpt2"])
def test_samples_split_stage_keeps_each_per_sample_residual_split(name):
  rows = residuals(name, range(4))
  per_sample = [r for r in rows if r.per_sample]
  assert len(per_sample) >= 3
  assert _unsplit(rows, 4) == []
  # what does not grow with the batch is small: layer-norm scales, scalars, never activations
  assert sum(r.global_bytes for r in rows if not r.per_sample) < 0.05 * sum(
      r.global_bytes for r in per_sample)


@pytest.mark.parametrize("name,layer,mesh,split", [
    ("digits_cnn", "conv2", (2, 4), "out"),
    pytest.param("gpt2", "h.0", (4, 2), "heads", marks=pytest.mark.slow)])
def test_weight_split_layer_keeps_each_per_sample_residual_split_by_samples(name, layer, mesh,
                                                                            split):
  rows = residuals(name, range(8), {layer: (mesh, split)}, layer)
  assert any(r.per_sample for r in rows)
  assert _unsplit(rows, mesh[0]) == []
