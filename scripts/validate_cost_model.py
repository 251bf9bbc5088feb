"""Per-layer error of the analytic cost model against DeepPool's A100 tables and this CPU.

python scripts/validate_cost_model.py [--cpu-models vgg16] [--cpu-max-batch 16] [--write-doc]

(a) A100: each zoo model at its ImageNet size, imported from the A100 tables shipped in dp_jax,
    against the plain roofline and against analytic.A100_VGG16_FIT (refitted here on VGG16 to
    show it is reproducible); errors at the tables' own per-device batches <= 32, per source row
    (a ResnetBottleneck row is compared with the sum over its block's layers).
(b) CPU: each --cpu-models model at 32x32 measured on this machine (cached under
    .cache/dp_jax/profiles) against the analytic model of the "cpu" device.
--write-doc replaces the results section of docs/cost_model.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dp_jax.hardware.devices import get_device
from dp_jax.layer_times import analytic, analytic_fit, layer_errors
from dp_jax.layer_times.deeppool_import import DEFAULT_DATA_DIR, import_deeppool_a100
from dp_jax.layer_times.table import ProfileTable
from dp_jax.measurement.alone import measure_profile, pow2_batches
from dp_jax.models.trace import trace_graph
from dp_jax.models.zoo import build_model

A100_MODELS = ("vgg16", "wide_resnet101_2", "inception_v3", "resnet50")
A100_BATCHES = (1, 2, 3, 4, 6, 8, 16, 32)
DOC = Path(__file__).resolve().parents[1] / "docs" / "cost_model.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _pct(x: float) -> str:
  return f"{100 * x:.0f}%"


def error_row(label: str, ref: ProfileTable, pred: ProfileTable, layers, batches, groups) -> str:
  rows = layer_errors.compare(ref, pred, layers, batches, groups)
  s = layer_errors.summarize(rows)
  lo, hi = min(batches), max(b for b in batches if all(b in ref.batches(n) for n in layers))
  return (f"| {label} | {s.n} | {_pct(s.median)} | {_pct(s.worst)} ({s.worst_at}) | "
          f"{s.median_ratio:.2f} | {ref.iteration_ms(lo, layers):.2f} / "
          f"{pred.iteration_ms(lo, layers):.2f} | {ref.iteration_ms(hi, layers):.2f} / "
          f"{pred.iteration_ms(hi, layers):.2f} |")


HEADER = ("| model | params | points | median error | worst error (at) | median pred/ref | "
          "iteration ms at b={lo}: ref / pred | at b={hi}: ref / pred |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")


def a100_section(data_dir: Path, out: list[str]) -> None:
  dev = get_device("A100-SXM4-40GB")
  graphs = {m: trace_graph(build_model(m, abstract=True), m) for m in A100_MODELS}
  imported = {m: import_deeppool_a100(g, data_dir) for m, g in graphs.items()}
  t0 = time.time()
  vgg_table, vgg_rep = imported["vgg16"]
  fit, err = analytic_fit.fit_params(graphs["vgg16"], vgg_table, dev, "mixed fp16",
                                  batches=A100_BATCHES, small_batch="tile")
  out.append(f"Refit on vgg16 ({time.time() - t0:.0f} s): {fit} (mean |log error| {err:.3f}); "
             f"analytic.A100_VGG16_FIT = {analytic.A100_VGG16_FIT}.\n")
  out.append("### Coverage of the import\n")
  out.append("| model | layers | matched | unmatched | unmatched layers | backward estimated |")
  out.append("| --- | --- | --- | --- | --- | --- |")
  for m, g in graphs.items():
    _, rep = imported[m]
    names = ", ".join(rep.unmatched) or "-"
    out.append(f"| {m} | {len(g.nodes)} | {len(rep.matched)} | {len(rep.unmatched)} | {names} | "
               f"{', '.join(rep.estimated) or '-'} |")
  notes = []
  for m, g in graphs.items():
    rep = imported[m][1]
    by_file: dict[str, list[str]] = {}
    for n, f in rep.sources.items():
      by_file.setdefault(f, []).append(g.node(n).kind)
    notes.append(f"{m}: " + "; ".join(
        f"{f}: {len(k)} layers ({', '.join(sorted(set(k)))})" for f, k in by_file.items()))
    notes += rep.notes
  out += ["", *[f"- {n}" for n in notes], ""]
  out.append("### Which small-batch term (each fitted on vgg16 only; median error per model)\n")
  out.append("| small-batch term | fitted params | " + " | ".join(graphs) + " |")
  out.append("| --- | --- | " + " | ".join("---" for _ in graphs) + " |")
  for term in (None, "flops", "tile"):
    p, _ = analytic_fit.fit_params(graphs["vgg16"], vgg_table, dev, "mixed fp16",
                                batches=A100_BATCHES, small_batch=term)
    meds = []
    for m, g in graphs.items():
      table, rep = imported[m]
      pred = analytic.analytic_profile(g, dev, "mixed fp16", A100_BATCHES, p)
      layers = [n for n in g.names if n in rep.matched]
      meds.append(_pct(layer_errors.summarize(
          layer_errors.compare(table, pred, layers, A100_BATCHES, rep.groups)).median))
    knobs = f"eff {p.compute_eff}/{p.memory_eff}, {p.kernel_overhead_us} us"
    knobs += {None: "", "flops": f", floor {p.small_batch_flops:.0e} FLOP",
              "tile": f", tile {p.tile}"}[term]
    out.append(f"| {term or 'none'} | {knobs} | " + " | ".join(meds) + " |")
  out.append("")
  out.append("### Analytic vs A100 tables (per source row, batches <= 32)\n")
  out.append(HEADER.format(lo=1, hi=32))
  variants = (("plain roofline", analytic.PLAIN), ("A100_VGG16_FIT", analytic.A100_VGG16_FIT),
              ("refit (this run)", fit))
  for m, g in graphs.items():
    table, rep = imported[m]
    layers = [n for n in g.names if n in rep.matched]
    for label, p in variants[:2] if fit == analytic.A100_VGG16_FIT else variants:
      pred = analytic.analytic_profile(g, dev, "mixed fp16", A100_BATCHES, p)
      tag = f"{m}{' (fit on this)' if m == 'vgg16' and p is not analytic.PLAIN else ''}"
      out.append(error_row(f"{tag} | {label}", table, pred, layers, A100_BATCHES, rep.groups))
  out.append("")


def cpu_section(models: list[str], size: int, max_batch: int, out: list[str]) -> None:
  dev = get_device("cpu")
  batches = pow2_batches(max_batch)
  out.append(f"### Analytic vs this CPU (measured, {size}x{size} images, float32)\n")
  out.append(HEADER.format(lo=1, hi=max_batch))
  timings = []
  for m in models:
    model = build_model(m, image_size=size, num_classes=10)
    g = trace_graph(model, m)
    t0 = time.time()
    measured = measure_profile(model, g, batches, progress=sys.stderr.isatty())
    timings.append(f"{m} {size}x{size}: measured in {time.time() - t0:.1f} s "
                   f"({measured.meta['counts']}); iteration ms by batch: " +
                   ", ".join(f"{b}: {measured.iteration_ms(b):.1f}" for b in batches))
    layers = list(g.names)
    for label, p in (("plain roofline", analytic.PLAIN),
                     ("A100_VGG16_FIT", analytic.A100_VGG16_FIT)):
      pred = analytic.analytic_profile(g, dev, "float32", batches, p)
      out.append(error_row(f"{m} | {label}", measured, pred, layers, batches, ()))
  out += ["", *[f"- {t}" for t in timings], ""]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
  p.add_argument("--cpu-models", default="vgg16")
  p.add_argument("--cpu-image-size", type=int, default=32)
  p.add_argument("--cpu-max-batch", type=int, default=16)  # 1..16: under 2 minutes here
  p.add_argument("--skip-cpu", action="store_true")
  p.add_argument("--write-doc", action="store_true")
  a = p.parse_args()
  cmd = "python scripts/validate_cost_model.py " + " ".join(sys.argv[1:])
  out = [f"Produced by `{cmd.strip()}` on {time.strftime('%Y-%m-%d')}.\n"]
  a100_section(a.data_dir, out)
  if not a.skip_cpu:
    cpu_section([m for m in a.cpu_models.split(",") if m], a.cpu_image_size, a.cpu_max_batch, out)
  text = "\n".join(out)
  print(text)
  if a.write_doc:
    doc = DOC.read_text()
    i, j = doc.index(START) + len(START), doc.index(END)
    DOC.write_text(doc[:i] + "\n" + text + "\n" + doc[j:])


if __name__ == "__main__":
  main()
