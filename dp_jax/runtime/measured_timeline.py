"""The measured timeline of one step as JSON in the simulator's format (alone.events).

Events follow dp_jax.simulator.timeline.Event.to_json: devices as [first, count] spans (a stage on
non-contiguous devices gives one event per span), stream compute|comm, kind fwd|bwd|move,
a label and start/end milliseconds from the step start. The last stage runs forward, loss,
backward and update as one program: its event has kind "bwd" and says so in its label.
Every call of the timed step was waited for, so events are serial: overlap does not show.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dp_jax.simulator.timeline import TIMELINE_SCHEMA

_KIND = {"fwd": ("compute", "fwd", "forward"), "bwd": ("compute", "bwd", "backward + update"),
         "fwd_bwd": ("compute", "bwd", "forward + loss + backward + update"),
         "transfer_fwd": ("comm", "move", "activations in"),
         "transfer_bwd": ("comm", "move", "gradients out")}


def spans(devices: Sequence[int]) -> list[tuple[int, int]]:
  """Sorted device indices as maximal contiguous (first, count) runs."""
  out: list[list[int]] = []
  for d in sorted(devices):
    if out and d == out[-1][0] + out[-1][1]:
      out[-1][1] += 1
    else:
      out.append([d, 1])
  return [(a, b) for a, b in out]


def timeline_json(events: Sequence[dict[str, Any]], stages: Sequence[Any], *, model: str,
                  global_batch: int, num_devices: int, step: int) -> dict[str, Any]:
  """Timer events {stage, phase, start_s, end_s} of one step as a measured timeline."""
  t0 = min(e["start_s"] for e in events)
  by_index = {s.index: s for s in stages}
  out = []
  for e in events:
    stream, kind, what = _KIND[e["phase"]]
    for span in spans(by_index[e["stage"]].devices):
      out.append({"devices": list(span), "stream": stream, "kind": kind,
                  "label": f"stage {e['stage']} {what}",
                  "start_ms": (e["start_s"] - t0) * 1e3, "end_ms": (e["end_s"] - t0) * 1e3})
  return {
      "schema": TIMELINE_SCHEMA, "source": "measured", "model": model,
      "num_devices": num_devices, "global_batch": global_batch, "step": step,
      "stages": [{"index": s.index, "devices": list(s.devices), "layers": list(s.layers)}
                 for s in stages],
      "alone": {"iteration_ms": max(e["end_ms"] for e in out), "events": out},
  }


def stage_ms(events: Sequence[dict[str, Any]]) -> dict[str, float]:
  """Milliseconds per stage (compute phases only, transfers excluded) of a timed step."""
  out: dict[str, float] = {}
  for e in events:
    if not e["phase"].startswith("transfer"):
      key = str(e["stage"])
      out[key] = out.get(key, 0.0) + (e["end_s"] - e["start_s"]) * 1e3
  return out


def write_timeline(path: str | Path, timeline: dict[str, Any]) -> Path:
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(timeline, indent=1))
  return path
