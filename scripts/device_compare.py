"""Per-layer times measured on this backend against the calibrated, analytic and A100 tables.

    .venv/bin/python scripts/device_compare.py --out results/device/<name>/layers \
        [--models vgg16,resnet50,...] [--max-batch 64] [--dtype bfloat16] [--tiny]

For each model: measure every layer at per-device batches 1, 2, 4, ... --max-batch on
jax.devices()[0] (dp_jax.measurement.alone, cached), then compare with (a) the calibrated profile
of the matching GPU (the default on GPU clusters, fitted on published rows; not on a CPU), (b)
the analytic roofline of the matching device in dp_jax/hardware/devices.py and (c) DeepPool's
measured A100 tables where they cover the model. Writes <model>_measured.json (a profile JSON),
compare.csv (one row per model and reference) and compare.md. --tiny uses CPU-sized models
(32x32 images, a 2-layer GPT-2).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TINY_GPT2 = {"n_layer": 2, "d_model": 64, "n_head": 2, "seq_len": 32, "vocab_size": 512}
DEVICE_NAMES = (("H200", "H200-SXM-141GB"), ("H100", "H100-SXM5-80GB"),
                ("A100", "A100-SXM4-80GB"), ("V100", "V100-SXM2-32GB"))
COLUMNS = ("model", "reference", "predicted", "points", "median_abs_pct_error",
           "worst_abs_pct_error", "worst_at", "median_ratio")


def analytic_device(device_kind: str, backend: str) -> str:
  """The DeviceSpec name for a JAX device kind ('cpu' on the CPU backend)."""
  if backend == "cpu":
    return "cpu"
  for key, name in DEVICE_NAMES:
    if key in device_kind:
      return name
  return "H100-SXM5-80GB"  # an unknown GPU is compared with the closest recent datasheet


def build(name: str, tiny: bool, dtype: str):
  from dp_jax.models.zoo import build_model

  if name.startswith("gpt2"):
    return build_model(name, dtype=dtype, **(TINY_GPT2 if tiny else {}))
  return build_model(name, dtype=dtype, **({"image_size": 32} if tiny else {}))


def compare_model(name: str, args, out: Path) -> list[dict]:
  """Measure one model and compare it with the analytic model and the A100 tables."""
  import jax

  from dp_jax.layer_times import layer_errors
  from dp_jax.layer_times.analytic import analytic_profile
  from dp_jax.layer_times.deeppool_import import import_deeppool_a100
  from dp_jax.measurement.alone import measure_profile, pow2_batches
  from dp_jax.models.trace import trace_graph

  model = build(name, args.tiny, args.dtype)
  graph = trace_graph(model, name)
  batches = pow2_batches(args.max_batch)
  measured = measure_profile(model, graph, batches, cache_dir=args.cache_dir, progress=False)
  measured.save(out / f"{name}_measured.json")
  dev = jax.devices()[0]
  device = analytic_device(dev.device_kind, jax.default_backend())
  refs = [("analytic", analytic_profile(graph, device, args.dtype, batches))]
  if device != "cpu":
    from dp_jax.layer_times.calibrated import calibrated_profile

    mixed = "mixed bf16" if args.dtype in ("bfloat16", "float32") else args.dtype
    refs.insert(0, ("calibrated", calibrated_profile(graph, device, mixed, batches)))
  try:
    table, report = import_deeppool_a100(graph)
    if len(report.unmatched) < len(graph.names) // 2:
      refs.append(("a100_tables", table))
  except Exception as e:  # noqa: BLE001 - a model without tables is compared with the model only
    print(f"{name}: no A100 tables ({e})")
  rows = []
  for label, pred in refs:
    layers = [n for n in graph.names if pred.batches(n)]
    s = layer_errors.summarize(layer_errors.compare(measured, pred, layers, batches))
    rows.append({"model": name, "reference": f"measured {dev.device_kind}", "predicted": label,
                 "points": s.n, "median_abs_pct_error": 100 * s.median,
                 "worst_abs_pct_error": 100 * s.worst, "worst_at": s.worst_at,
                 "median_ratio": s.median_ratio})
  return rows


def main(argv: list[str] | None = None) -> int:
  from dp_jax.models.zoo import MODEL_NAMES

  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--models", default=",".join(MODEL_NAMES))
  ap.add_argument("--max-batch", type=int, default=64)
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--tiny", action="store_true")
  ap.add_argument("--cache-dir", default=".cache/dp_jax/profiles")
  args = ap.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  rows = []
  for name in args.models.split(","):
    rows += compare_model(name, args, out)
    print(f"{name}: " + "; ".join(f"{r['predicted']} median |err| "
                                  f"{r['median_abs_pct_error']:.0f}%" for r in rows
                                  if r["model"] == name))
  with (out / "compare.csv").open("w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)
  lines = ["| model | predicted by | points | median abs error | worst (at) | median pred/meas |",
           "| --- | --- | --- | --- | --- | --- |"]
  lines += [f"| {r['model']} | {r['predicted']} | {r['points']} | "
            f"{r['median_abs_pct_error']:.0f}% | {r['worst_abs_pct_error']:.0f}% "
            f"({r['worst_at']}) | {r['median_ratio']:.2f} |" for r in rows]
  (out / "compare.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {out / 'compare.csv'} and compare.md")
  return 0


if __name__ == "__main__":
  sys.exit(main())
