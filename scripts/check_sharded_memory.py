"""Check the memory model's saved activations of weight-sharded layers against the runtime.

For each case, one layer runs alone in a stage on a (d, m) mesh of 8 CPU devices (its
neighbours on 4 devices, so it gets its own stage); the stage's `fwd` program (runtime/step.py:
jax.vjp inside jit, the residuals are outputs of the jit) runs once and the bytes device 0
holds for the layer's backward are summed: the VJP's residual leaves plus the stage input the
step keeps with it. Also reported: the bytes of residuals that grow with the batch but are not
split over "data" (more than 1/d of their global bytes on a device; runtime/residuals.py),
which the memory model does not count (0 since models/ops.py). Predicted:
memory.split_saved_per_sample x B / d (the traced graph's saved bytes, float32).
Deterministic (byte counts, no timing).

    .venv/bin/python scripts/check_sharded_memory.py [--out results.csv]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from dp_jax.models import digits, gpt2, vgg  # noqa: E402
from dp_jax.models.trace import trace_graph  # noqa: E402
from dp_jax.planner import memory  # noqa: E402
from dp_jax.planner.contract import (
  check_plan,  # noqa: E402
  layout_plan,  # noqa: E402
)
from dp_jax.runtime.functional import split_layers  # noqa: E402
from dp_jax.runtime.residuals import stage_residuals  # noqa: E402
from dp_jax.runtime.stages import structure_graph  # noqa: E402
from dp_jax.runtime.step import build_program, init_state  # noqa: E402

GPT2_A = dict(n_layer=2, d_model=32, n_head=2, seq_len=16, vocab_size=64)
GPT2_B = dict(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab_size=64)
MODELS = {
    "vgg16_32": lambda: vgg.VGG16(image_size=32, num_classes=10, rngs=nnx.Rngs(0)),
    "gpt2_d32": lambda: gpt2.GPT2(**GPT2_A, rngs=nnx.Rngs(0)),
    "gpt2_d64": lambda: gpt2.GPT2(**GPT2_B, rngs=nnx.Rngs(0)),
    "digits_cnn": lambda: digits.DigitsCNN(rngs=nnx.Rngs(0)),
}
CASES = (  # (model, layer, (d, m), split)
    ("vgg16_32", "classifier.0", (1, 8), "out"),
    ("vgg16_32", "classifier.0", (2, 4), "out"),
    ("vgg16_32", "classifier.0", (1, 8), "in"),
    ("vgg16_32", "classifier.2", (2, 4), "in"),
    ("gpt2_d32", "h.0", (4, 2), "heads"),
    ("gpt2_d64", "h.0", (4, 2), "heads"),
    ("gpt2_d64", "h.0", (2, 4), "heads"),
    ("digits_cnn", "conv2", (2, 4), "out"),
    ("gpt2_d64", "h.0", (8, 1), "samples"),
    ("digits_cnn", "conv2", (8, 1), "samples"),
)
BATCH = 8


def _on(tree, device) -> int:
  return sum(s.data.nbytes for a in jax.tree.leaves(tree) if hasattr(a, "addressable_shards")
             for s in a.addressable_shards if s.device == device)


def measure(model_name: str, layer: str, mesh: tuple[int, int], split: str,
            batch: int = BATCH) -> dict:
  """Predicted and runtime bytes device 0 keeps for `layer`'s backward under the split."""
  model = MODELS[model_name]()
  graph = structure_graph(model, model_name)
  traced = trace_graph(MODELS[model_name](), model_name)
  node = traced.node(layer)
  plan = layout_plan(graph, lambda n: range(8) if n == layer else range(4), global_batch=batch,
                     num_devices=8, shardings={layer: (mesh, split)})
  defs, params, stats = split_layers(model)
  opt = optax.sgd(0.1)
  program = build_program(graph, defs, check_plan(plan, graph, available_devices=8), opt,
                          jax.devices()[:8])
  state = init_state(program, params, stats, opt)
  sp = program.stages[program.stage_of[layer]]
  assert sp.stage.layers == (layer,), sp.stage.layers
  ins = {src: jax.device_put(np.ones((batch, *traced.node(src).out_shape), np.float32), sp.batch)
         for src in sp.stage.inputs}
  p, st = {layer: state["params"][layer]}, {layer: state["stats"][layer]}
  vjp, rows = stage_residuals(sp, p, st, {}, ins, None)
  unsplit = sum(r.device_bytes for r in rows
                if r.per_sample and r.device_bytes > r.global_bytes / mesh[0])
  runtime = _on(vjp, sp.mesh.devices.flat[0]) + _on(ins, sp.mesh.devices.flat[0])
  in_bytes = sum(traced.node(p).out_bytes_per_sample for p in node.inputs)
  per_sample = memory.split_saved_per_sample(float(node.saved_bytes_per_sample), in_bytes,
                                             node.out_bytes_per_sample, (mesh[1], split))
  samples_only = memory.split_saved_per_sample(float(node.saved_bytes_per_sample), in_bytes,
                                               node.out_bytes_per_sample, None)
  return {"model": model_name, "layer": layer, "mesh": f"{mesh[0]}x{mesh[1]}", "split": split,
          "global_batch": batch, "predicted_bytes": per_sample * (batch // mesh[0]),
          "runtime_bytes": runtime, "runtime_unsplit_per_sample_bytes": unsplit,
          "unsplit_predicted_bytes": samples_only * (batch // mesh[0])}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", type=Path, default=None)
  args = ap.parse_args()
  rows = [measure(*case) for case in CASES]
  print("| layer | mesh | split | predicted bytes | runtime bytes | predicted / runtime | "
        "unsplit (samples) prediction | runtime per-sample bytes not split by samples |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for r in rows:
    print(f"| {r['model']} {r['layer']} | {r['mesh']} | {r['split']} | {r['predicted_bytes']:.0f} "
          f"| {r['runtime_bytes']} | {r['predicted_bytes'] / r['runtime_bytes']:.3f} | "
          f"{r['unsplit_predicted_bytes']:.0f} | {r['runtime_unsplit_per_sample_bytes']} |")
  if args.out:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=list(rows[0]))
      w.writeheader()
      w.writerows(rows)


if __name__ == "__main__":
  jnp.zeros(1).block_until_ready()
  main()
