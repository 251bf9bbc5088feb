"""Shared helpers of the runtime tests: tiny models, layouts, the single-device reference."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dp_jax.models import digits, gpt2, inception, resnet, vgg
from dp_jax.planner.contract import check_plan, layout_plan
from dp_jax.runtime import mesh as meshlib
from dp_jax.runtime.batch_norm import set_statistics_groups
from dp_jax.runtime.functional import split_layers, write_back
from dp_jax.runtime.fused import fused_step
from dp_jax.runtime.stages import structure_graph
from dp_jax.runtime.step import build_program, init_state, train_step

TINY_GPT2 = dict(n_layer=2, d_model=32, n_head=2, seq_len=16, vocab_size=64)


def make_model(name: str, dtype=jnp.float32, seed: int = 0):
  """A zoo model at test size (built from its class, so float64 is possible)."""
  kw = dict(dtype=dtype, rngs=nnx.Rngs(seed))
  if name == "vgg16":
    return vgg.VGG16(image_size=32, num_classes=10, **kw)
  if name == "resnet50":
    return resnet.ResNet((3, 4, 6, 3), image_size=32, num_classes=10, **kw)
  if name == "wide_resnet50_2":
    return resnet.ResNet((3, 4, 6, 3), width_per_group=128, image_size=32, num_classes=10, **kw)
  if name == "wide_resnet101_2":
    return resnet.ResNet((3, 4, 23, 3), width_per_group=128, image_size=32, num_classes=10, **kw)
  if name == "inception_v3":
    return inception.InceptionV3(image_size=inception.MIN_IMAGE_SIZE, num_classes=10, **kw)
  if name == "digits_cnn":
    return digits.DigitsCNN(**kw)
  if name.startswith("gpt2"):
    return gpt2.GPT2(**TINY_GPT2, **kw)
  raise ValueError(name)


def batches(model, batch: int, steps: int, dtype=np.float32, seed: int = 0):
  """`steps` fixed (x, y) numpy batches for `model`."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(steps):
    if isinstance(model, gpt2.GPT2):
      tok = rng.integers(0, model.vocab_size, (batch, model.seq_len + 1), dtype=np.int32)
      out.append((tok[:, :-1], tok[:, 1:]))
    else:
      out.append((rng.standard_normal(model.input_spec(batch).shape).astype(dtype),
                  rng.integers(0, model.num_classes, (batch,), dtype=np.int32)))
  return out


def run_plan(model, name: str, layout, data, optimizer, num_devices: int = 8,
             batch_norm: str = "sync", shardings=None):
  """Train `model` under a layout plan (weight-sharded layers: `shardings` as layout_plan takes
  them) on the given batches; (losses, program, state)."""
  graph = structure_graph(model, name)
  plan = layout_plan(graph, layout, global_batch=len(data[0][0]), num_devices=num_devices,
                     shardings=shardings)
  plan["options"] = {"batch_norm": batch_norm}
  checked = check_plan(plan, graph, available_devices=len(jax.devices()))
  set_statistics_groups(model, checked)
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, checked, optimizer, jax.devices())
  state = init_state(program, params, stats, optimizer)
  losses = []
  for x, y in data:
    xs = jax.device_put(x, program.input_stage.batch)
    ys = jax.device_put(y, program.last_stage.batch)
    state, loss = train_step(program, state, xs, ys)
    losses.append(float(loss))
  write_back(model, defs, state["params"], state["stats"])
  return losses, program, state


def run_reference(model, data, optimizer):
  """The whole model as one jit on one device: losses; trained values land in `model`."""
  mesh = meshlib.stage_mesh(jax.devices()[:1])
  step, (params, rest, opt) = fused_step(model, optimizer, mesh)
  losses = []
  for x, y in data:
    loss, params, rest, opt = step(params, rest, opt, x, y)
    losses.append(float(loss))
  nnx.update(model, params, rest)
  return losses


def state_diffs(a, b, initial, kind=nnx.Param) -> tuple[float, float]:
  """Largest |a - b| and |b - initial| over the `kind` variables of two models, each scaled
  by max(1, largest |b|) of its tensor (absolute for weights, relative for big statistics)."""
  diff = update = 0.0
  states = (jax.tree.leaves(nnx.state(m, kind)) for m in (a, b, initial))
  for u, v, w in zip(*states, strict=True):
    u, v, w = np.asarray(u), np.asarray(v), np.asarray(w)
    scale = max(1.0, float(np.abs(v).max()))
    diff = max(diff, float(np.abs(u - v).max()) / scale)
    update = max(update, float(np.abs(v - w).max()) / scale)
  return diff, update


def by_prefix(rules: Sequence[tuple[str, Sequence[int]]],
              default: Sequence[int]) -> Callable[[str], Sequence[int]]:
  """A layout: the devices of the first rule whose prefix starts the layer name."""

  def devices(name: str) -> Sequence[int]:
    for prefix, devs in rules:
      if name.startswith(prefix):
        return devs
    return default

  return devices


def sgd():
  return optax.sgd(0.05, momentum=0.9)
