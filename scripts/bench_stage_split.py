"""What a stage boundary costs one layer: fused forward+backward vs forward and backward programs.

    .venv/bin/python scripts/bench_stage_split.py                 # tiny GPT-2 block h.1, B=32
    [--layer h.1] [--batch 32] [--rounds 40] [--out bench_stage_split.json]

A non-last stage of the runtime runs its layers as two programs (dp_jax/runtime/step.py):
`fwd` returns the activations and the VJP residuals (the runtime keeps matmul and convolution
outputs: dp_jax/runtime/residuals.py), `bwd` applies the VJP. The last stage runs one fused
program. For one layer, on 1 device and on one device per core (batch split), this times in one
process (medians, measured; every run timed right after a run of its own, as in training:
dp_jax.measurement.plan_timing.turns):
  fused           one jit of the layer's jax.vjp applied to a cotangent (forward and backward);
  fwd             one jit of the layer's forward alone (no residuals);
then for each residual policy (the runtime's `kept`; `nothing`: the backward recomputes the
whole forward; `everything`: every intermediate kept):
  fwd_res         the forward program (activations + residuals);
  bwd             the backward program on those residuals;
  split           fwd_res, then bwd, as one step of a stage runs them;
and prints split/fused, the residual bytes and, for the runtime's policy, the kernels
(top-level fusions, dots, copies in XLA's optimized HLO) of each program. Optimizer update and
gradient all-reduce are left out: both paths would run the same ones.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dp_jax.runtime import local_devices  # noqa: E402  (imports no JAX)

TINY_GPT2 = dict(n_layer=2, d_model=64, n_head=2, seq_len=32, vocab_size=512)
KERNELS = ("fusion", "dot", "convolution", "copy", "transpose", "all-reduce")


def parse_args():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layer", default="h.1")
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--rounds", type=int, default=40)
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

  from dp_jax.measurement.plan_timing import timed, turns
  from dp_jax.models.zoo import build_model
  from dp_jax.runtime import residuals
  from dp_jax.runtime.functional import apply_layer, split_layers

  defs, params, stats = split_layers(build_model("gpt2_small", **TINY_GPT2))
  if args.layer not in defs:
    sys.exit(f"error: no layer '{args.layer}' in the tiny GPT-2; use one of {sorted(defs)}")
  d, st = defs[args.layer], stats[args.layer]
  x_shape = (args.batch, TINY_GPT2["seq_len"], TINY_GPT2["d_model"])

  def layer(p, x):
    return apply_layer(d, p, st, [x])[0]

  policies = {"kept": residuals.saved, "nothing": jax.checkpoint_policies.nothing_saveable,
              "everything": jax.checkpoint_policies.everything_saveable}
  fused = jax.jit(lambda p, x, ct: jax.vjp(layer, p, x)[1](ct))
  fwd = jax.jit(layer)

  def forward_program(policy):
    kept = jax.checkpoint(layer, policy=policy)
    return jax.jit(lambda p, x: jax.vjp(kept, p, x, saveable_args=False))

  fwd_res = {name: forward_program(pol) for name, pol in policies.items()}
  bwd = jax.jit(lambda vjp, p, x, ct: vjp.replace(args_res=[p, x])(ct))

  runs, report = {}, {}
  for g in sorted({1, len(jax.devices())}):
    mesh = Mesh(jax.devices()[:g], ("data",))
    p = jax.device_put(params[args.layer], NamedSharding(mesh, P()))
    x = jax.device_put(jax.random.normal(jax.random.key(0), x_shape),
                       NamedSharding(mesh, P("data")))
    runs[(g, "fused")] = lambda p=p, x=x: fused(p, x, x)
    runs[(g, "fwd")] = lambda p=p, x=x: fwd(p, x)
    report[g] = {"residuals": {}}
    for name, fr in fwd_res.items():
      vjp = fr(p, x)[1]
      res = jax.tree.leaves(vjp)
      report[g]["residuals"][name] = {"arrays": len(res), "mb": sum(a.nbytes for a in res) / 1e6}
      if name == "kept":
        report[g]["kernels"] = {"fused": kernels(fused.lower(p, x, x).compile().as_text()),
                                "fwd_res": kernels(fr.lower(p, x).compile().as_text()),
                                "bwd": kernels(bwd.lower(vjp, p, x, x).compile().as_text())}
      runs[(g, f"{name}.fwd_res")] = lambda fr=fr, p=p, x=x: fr(p, x)
      runs[(g, f"{name}.bwd")] = lambda vjp=vjp, p=p, x=x: bwd(vjp, p, x, x)
      runs[(g, f"{name}.split")] = lambda fr=fr, p=p, x=x: bwd(fr(p, x)[1], p, x, x)
  samples = turns([timed(lambda run=run: jax.block_until_ready(run())) for run in runs.values()],
                  args.rounds, warmup=2)
  med = {key: statistics.median(ms for ms, _ in s) for key, s in zip(runs, samples, strict=True)}
  print(f"tiny GPT-2 layer {args.layer}, B={args.batch}, {args.rounds} rounds, each run timed "
        f"after one of its own, {cores} cores (median ms, measured)")
  for g, r in report.items():
    r["ms"] = {name: ms for (gg, name), ms in med.items() if gg == g}
    print(f"{g} device(s): fused {med[(g, 'fused')]:.2f} ms, forward alone {med[(g, 'fwd')]:.2f}")
    for name, res in r["residuals"].items():
      split = med[(g, f"{name}.split")]
      res["split_over_fused"] = split / med[(g, "fused")]
      print(f"   residuals {name:10s} ({res['arrays']:2d} arrays, {res['mb']:5.2f} MB): "
            f"fwd_res {med[(g, f'{name}.fwd_res')]:.2f}, bwd {med[(g, f'{name}.bwd')]:.2f}, "
            f"split {split:.2f} ms = {res['split_over_fused']:.2f} x fused")
    print(f"   kernels (kept): fused {r['kernels']['fused']}, fwd_res {r['kernels']['fwd_res']}, "
          f"bwd {r['kernels']['bwd']}")
  if args.out:
    Path(args.out).write_text(json.dumps({"layer": args.layer, "batch": args.batch,
                                          "rounds": args.rounds, "cores": cores,
                                          "devices": {str(g): r for g, r in report.items()}},
                                         indent=1))


if __name__ == "__main__":
  main()
