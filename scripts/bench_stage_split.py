"""What a stage boundary costs one layer: its fused forward+backward vs a forward and a backward program.

    .venv/bin/python scripts/bench_stage_split.py                 # tiny GPT-2 block h.1, B=32
    [--layer h.1] [--batch 32] [--rounds 60] [--out bench_stage_split.json]

A non-last stage of the runtime runs its layers as two programs (dp_jax/runtime/step.py):
`fwd` returns the activations and the VJP residuals (the runtime's policy,
dp_jax/runtime/residuals.py), `bwd` applies the VJP. The last stage runs one fused program.
For one layer, on 1 device and on one device per core (batch split), this times, interleaved
in one process (medians, measured):
  fused     one jit of the layer's jax.vjp applied to a cotangent (forward and backward fused);
  fwd       one jit of the layer's forward alone (no residuals);
  fwd_res   the runtime's forward program (activations + residuals);
  split     fwd_res, then the runtime's backward program;
and prints split/fused, the kernels (top-level fusions, dots, copies in XLA's optimized HLO)
of each program, and the residual bytes. Optimizer update and gradient all-reduce are left out:
both paths would run the same ones. No flags, no other layers: the difference is what XLA can
fuse across the forward/backward boundary of one program but not across two.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dp_jax.runtime import local_devices  # noqa: E402  (imports no JAX)

TINY_GPT2 = dict(n_layer=2, d_model=64, n_head=2, seq_len=32, vocab_size=512)
KERNELS = ("fusion", "dot", "convolution", "copy", "transpose", "all-reduce")


def parse_args():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layer", default="h.1")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--rounds", type=int, default=60)
  ap.add_argument("--out", default=None)
  return ap.parse_args()


def kernels(hlo_text: str) -> dict[str, int]:
  """Top-level instructions of the entry computation of an optimized HLO module, by kind."""
  entry = hlo_text.split("ENTRY", 1)[1]
  found = collections.Counter(re.findall(r"= \S+ ([\w-]+)\(", entry))
  return {k: found[k] for k in KERNELS if found[k]}


def main() -> None:
  args = parse_args()
  cores = local_devices.cpu_cores()
  local_devices.set_host_device_count(cores)
  import jax
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from dp_jax.models.registry import build_model
  from dp_jax.runtime import residuals
  from dp_jax.runtime.functional import apply_layer, split_layers

  defs, params, stats = split_layers(build_model("gpt2_small", **TINY_GPT2))
  if args.layer not in defs:
    sys.exit(f"error: no layer '{args.layer}' in the tiny GPT-2; use one of {sorted(defs)}")
  d, st = defs[args.layer], stats[args.layer]
  x_shape = (args.batch, TINY_GPT2["seq_len"], TINY_GPT2["d_model"])

  def layer(p, x):
    return apply_layer(d, p, st, [x])[0]

  kept = jax.checkpoint(layer, policy=residuals.saved)
  fused = jax.jit(lambda p, x, ct: jax.vjp(layer, p, x)[1](ct))
  fwd = jax.jit(layer)
  fwd_res = jax.jit(lambda p, x: jax.vjp(kept, p, x, saveable_args=False))
  bwd = jax.jit(lambda vjp, p, x, ct: vjp.replace(args_res=[p, x])(ct))

  runs, report = {}, {}
  for g in sorted({1, len(jax.devices())}):
    mesh = Mesh(jax.devices()[:g], ("data",))
    p = jax.device_put(params[args.layer], NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(jax.random.key(0), x_shape), NamedSharding(mesh, P("data")))
    _, vjp = fwd_res(p, x)
    res = jax.tree.leaves(vjp)
    report[g] = {"residual_arrays": len(res), "residual_mb": sum(a.nbytes for a in res) / 1e6,
                 "kernels": {"fused": kernels(fused.lower(p, x, x).compile().as_text()),
                             "fwd_res": kernels(fwd_res.lower(p, x).compile().as_text()),
                             "bwd": kernels(bwd.lower(vjp, p, x, x).compile().as_text())}}
    runs[(g, "fused")] = lambda p=p, x=x: fused(p, x, x)
    runs[(g, "fwd")] = lambda p=p, x=x: fwd(p, x)
    runs[(g, "fwd_res")] = lambda p=p, x=x: fwd_res(p, x)
    runs[(g, "split")] = lambda p=p, x=x: bwd(fwd_res(p, x)[1], p, x, x)
  for run in runs.values():
    for _ in range(3):
      jax.block_until_ready(run())
  times = collections.defaultdict(list)
  for _ in range(args.rounds):
    for key, run in runs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(run())
      times[key].append((time.perf_counter() - t0) * 1e3)
  med = {k: statistics.median(v) for k, v in times.items()}
  print(f"tiny GPT-2 layer {args.layer}, B={args.batch}, {args.rounds} interleaved rounds, "
        f"{cores} cores (median ms, measured)")
  for g, r in report.items():
    r["ms"] = {name: med[(g, name)] for name in ("fused", "fwd", "fwd_res", "split")}
    r["split_over_fused"] = med[(g, "split")] / med[(g, "fused")]
    print(f"{g} device(s): fused {med[(g, 'fused')]:.2f}, fwd {med[(g, 'fwd')]:.2f}, "
          f"fwd_res {med[(g, 'fwd_res')]:.2f}, split {med[(g, 'split')]:.2f} ms: "
          f"split/fused = {r['split_over_fused']:.3f}; residuals {r['residual_arrays']} arrays "
          f"{r['residual_mb']:.2f} MB")
    print(f"   kernels: fused {r['kernels']['fused']}, fwd_res {r['kernels']['fwd_res']}, "
          f"bwd {r['kernels']['bwd']}")
  if args.out:
    Path(args.out).write_text(json.dumps({"layer": args.layer, "batch": args.batch,
                                          "rounds": args.rounds, "cores": cores,
                                          "devices": {str(g): r for g, r in report.items()}},
                                         indent=1))


if __name__ == "__main__":
  main()
