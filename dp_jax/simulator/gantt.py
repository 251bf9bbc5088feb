"""Gantt chart PNG of an iteration: a row per device, foreground, communication and background."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from dp_jax.simulator.timeline import Event
from dp_jax.simulator.windows import DeviceClasses

COLORS = {"fwd": "#4C72B0", "bwd": "#DD8452", "move": "#8172B3", "allreduce": "#C44E52",
          "bg": "#55A868"}
LEGEND = {"fwd": "forward", "bwd": "backward", "move": "activation / gradient move",
          "allreduce": "gradient all-reduce", "bg": "background pieces"}
MAX_ROWS = 64


def rows_for(num_devices: int, classes: DeviceClasses | None = None,
             max_rows: int = MAX_ROWS) -> tuple[list[int], list[str]]:
  """Devices to draw and their labels: all up to max_rows, else one per class (evenly thinned)."""
  if num_devices <= max_rows or classes is None:
    devs = list(range(min(num_devices, max_rows)))
    return devs, [str(d) for d in devs]
  picks = list(range(len(classes)))
  if len(picks) > max_rows:
    picks = sorted({int(round(x)) for x in np.linspace(0, len(classes) - 1, max_rows)})
  b = classes.bounds
  labels = [f"{b[k]}-{b[k + 1] - 1}" if b[k + 1] - b[k] > 1 else str(b[k]) for k in picks]
  return [int(b[k]) for k in picks], labels


def plot_gantt(events: Iterable[Event], num_devices: int, path: str | Path, *, title: str,
               classes: DeviceClasses | None = None, marks: Sequence[tuple[str, float]] = (),
               max_rows: int = MAX_ROWS) -> Path:
  """Draw `events` (device spans) to a PNG and a PDF beside it; more than max_rows devices:
  representatives. The title should say whether the events are simulated or measured."""
  fig = gantt_figure(events, num_devices, title=title, classes=classes, marks=marks,
                     max_rows=max_rows)
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  fig.savefig(path.with_suffix(".pdf"), bbox_inches="tight", metadata={"CreationDate": None})
  return path


def gantt_figure(events: Iterable[Event], num_devices: int, *, title: str,
                 classes: DeviceClasses | None = None, marks: Sequence[tuple[str, float]] = (),
                 max_rows: int = MAX_ROWS):
  """The Gantt chart of plot_gantt as a matplotlib Figure (not saved; text >= 8 pt)."""
  # matplotlib: only to draw (the simulator's numbers need none); a Figure without pyplot
  from matplotlib.collections import PolyCollection
  from matplotlib.figure import Figure
  from matplotlib.patches import Patch

  devices, labels = rows_for(num_devices, classes, max_rows)
  row_of = {d: r for r, d in enumerate(devices)}
  bars: dict[str, tuple[list[float], list[float], list[float]]] = {k: ([], [], []) for k in COLORS}
  for ev in events:
    first, count = ev.devices
    lefts, widths, ys = bars[ev.kind]
    comm = ev.stream == "comm"
    for d in devices if count > 8 else range(first, first + count):
      if first <= d < first + count and d in row_of:
        lefts.append(ev.start_ms)
        widths.append(ev.end_ms - ev.start_ms)
        ys.append(row_of[d] + (0.3 if comm else -0.12))
  height = 1.8 + 0.24 * len(devices)
  fig = Figure(figsize=(13, height), layout="constrained")
  ax = fig.subplots()
  right = 0.0
  for kind, (lefts, widths, ys) in bars.items():
    if lefts:
      half = 0.13 if kind in ("move", "allreduce") else 0.28
      x0, w, y = np.array(lefts), np.array(widths), np.array(ys)
      verts = np.stack([np.stack([x0, y - half], 1), np.stack([x0 + w, y - half], 1),
                        np.stack([x0 + w, y + half], 1), np.stack([x0, y + half], 1)], 1)
      ax.add_collection(PolyCollection(verts, facecolors=COLORS[kind], edgecolors=COLORS[kind],
                                       linewidths=0.2))
      right = max(right, float((x0 + w).max()))
  right = max([right] + [x for _, x in marks])
  ax.set_xlim(0, right * 1.03 if right > 0 else 1.0)
  for (text, x), style in zip(marks, ("--", ":", "-."), strict=False):
    ax.axvline(x, color="black", linestyle=style, linewidth=1, label=text)
  ax.set_yticks(range(len(devices)), labels, fontsize=8 if len(devices) > 16 else 9)
  ax.set_ylim(len(devices) - 0.4, -0.6)
  ax.set_ylabel("device (index)" if len(devices) == num_devices
                else "devices (one row per group)")
  ax.set_xlabel("time in the iteration (ms)")
  handles = [Patch(color=COLORS[k], label=LEGEND[k]) for k in COLORS if bars[k][0]]
  handles += [h for h in ax.get_legend_handles_labels()[0] if not isinstance(h, Patch)]
  fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
  if len(devices) < num_devices:
    title += (f"\nshowing {len(devices)} of {num_devices} devices: one row per group of "
              "devices with identical work")
  ax.set_title(title, fontsize=10)
  ax.tick_params(axis="x", labelsize=9)
  return fig
