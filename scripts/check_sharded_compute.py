"""Check the planner's sharded-shape compute against a measurement on one CPU device.

The planner prices a weight-sharded layer's compute as the profile's time of the whole layer
times the analytic roofline's ratio (sharded shape / whole layer) at the same per-device batch
(dp_jax/planner/sharded.py, compute_ratios). This script times, on one CPU device, the forward
plus backward (input and weight gradients) of a linear layer (out and in split) and a
convolution (output channels split) at m = 1, 2, 4 (interleaved, least time of --repeats), and
prints the measured ratio t(m) / t(1) next to the predicted one. Timings on a loaded machine are
contended: run it on an idle one.

    .venv/bin/python scripts/check_sharded_compute.py [--repeats 30] [--out results.csv]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

# one CPU device on one thread: a shared machine's load then slows every shape alike
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1 "
                      "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from dp_jax.graph.layer_graph import LayerGraph, LayerNode  # noqa: E402
from dp_jax.hardware.devices import get_device  # noqa: E402
from dp_jax.layer_times.analytic import default_params, layer_cost, layer_times_ms  # noqa: E402
from dp_jax.planner.sharded import compute_ratios  # noqa: E402

CPU = get_device("cpu")
MS = (1, 2, 4)

CASES = (  # (name, kind, per-device batch, whole-layer sizes)
    ("linear 1024->4096", "linear", 32, {"in_features": 1024, "out_features": 4096}),
    ("conv 3x3 64->128 @28x28", "conv2d", 8, {"in_channels": 64, "out_channels": 128, "hw": 28}),
)


def graph_of(kind: str, sizes: dict) -> tuple[LayerGraph, LayerNode]:
  """A two-layer graph (an elementwise layer, then the layer) so the layer has an input
  gradient, as in a model; FLOPs and bytes come from the analytic formulas."""
  if kind == "linear":
    k, n = sizes["in_features"], sizes["out_features"]
    shape_in, shape_out, params = (k,), (n,), k * n + n
    attrs = {"in_features": k, "out_features": n, "bias": True}
  else:
    c, o, hw = sizes["in_channels"], sizes["out_channels"], sizes["hw"]
    shape_in, shape_out, params = (hw, hw, c), (hw, hw, o), 9 * c * o + o
    attrs = {"in_channels": c, "out_channels": o, "kernel_size": [3, 3], "stride": [1, 1],
             "padding": [1, 1], "batch_norm": False, "activation": None}
  numel_in = 1
  for d in shape_in:
    numel_in *= d
  numel_out = 1
  for d in shape_out:
    numel_out *= d
  pre = LayerNode("pre", "relu", (), 0, 0, shape_in, 4 * numel_in)
  node = LayerNode("layer", kind, ("pre",), params, 4 * params, shape_out, 4 * numel_out,
                   attrs=attrs)
  return LayerGraph("check", shape_in, "float32", (pre, node)), node


def step_fn(kind: str, sizes: dict, split: str, m: int, batch: int):
  """(jitted fwd+bwd, its arguments) of the layer's sharded shape on one device."""
  key = jax.random.key(0)
  if kind == "linear":
    k, n = sizes["in_features"], sizes["out_features"]
    k, n = (k // m, n) if split == "in" else (k, n // m)
    x = jax.random.normal(key, (batch, k))
    w, b = jax.random.normal(key, (k, n)) * 0.01, jnp.zeros((n,))

    def loss(w, b, x):
      return jnp.sum(x @ w + b)
  else:
    c, o, hw = sizes["in_channels"], sizes["out_channels"] // m, sizes["hw"]
    x = jax.random.normal(key, (batch, hw, hw, c))
    w, b = jax.random.normal(key, (3, 3, c, o)) * 0.01, jnp.zeros((o,))

    def loss(w, b, x):
      y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
      return jnp.sum(y + b)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (w, b, x)


def time_ms(calls: list, repeats: int) -> list[float]:
  """Least CPU time of the process (ms; one compute thread, so it is the work's time and not
  what other jobs on a shared machine take from it) of each (fn, args), interleaved
  round-robin after one warm-up call each."""
  for fn, args in calls:
    jax.block_until_ready(fn(*args))
  times = [[] for _ in calls]
  for _ in range(repeats):
    for i, (fn, args) in enumerate(calls):
      t = time.process_time()
      jax.block_until_ready(fn(*args))
      times[i].append((time.process_time() - t) * 1e3)
  return [min(t) for t in times]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repeats", type=int, default=30)
  ap.add_argument("--out", type=Path, default=None)
  args = ap.parse_args()
  rows = []
  for name, kind, batch, sizes in CASES:
    graph, node = graph_of(kind, sizes)
    for split in (("out", "in") if kind == "linear" else ("out",)):
      measured = time_ms([step_fn(kind, sizes, split, m, batch) for m in MS], args.repeats)
      base = measured[0]
      for m, ms in zip(MS, measured, strict=True):
        if m == 1:
          predicted = 1.0
        else:
          rf, rb = compute_ratios(graph, node, (m, split), batch, "cpu", "float32")
          f0, b0 = layer_times_ms(layer_cost(graph, node, "float32"), CPU, "float32", batch,
                                  default_params(CPU))
          predicted = (f0 * rf + b0 * rb) / (f0 + b0)  # the whole step's ratio
        rows.append({"layer": name, "split": split, "m": m, "batch": batch,
                     "measured_ms": round(ms, 4), "measured_ratio": round(ms / base, 4),
                     "predicted_ratio": round(predicted, 4)})
        print(f"{name:26s} {split:4s} m={m}  measured {ms:8.3f} ms  ratio {ms / base:.3f}  "
              f"predicted {predicted:.3f}", flush=True)
  if args.out:
    with open(args.out, "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=list(rows[0]))
      w.writeheader()
      w.writerows(rows)


if __name__ == "__main__":
  main()
