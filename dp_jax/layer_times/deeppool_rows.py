"""Parse DeepPool's A100 layer-timing files (*.prof, *.txt) into typed rows."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dp_jax.base.errors import UserError

_KEY = re.compile(r"^(?P<kind>[A-Za-z0-9_]+)(?P<params>\{.*\})\[(?P<batch>\d+)\]"
                  r"(?:\[(?P<dims>[\d,]+)\]|(?P<flat>\d+))$")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


@dataclass(frozen=True)
class Row:
  """One layer's timing at one per-device batch, as a DeepPool file records it."""

  kind: str  # DeepPool's layer kind: conv2d, ReLU2d, maxPool2d, ResnetBottleneck, ...
  params: dict[str, Any]
  batch: int
  dims: tuple[int, ...]  # per-sample input dims as written (C,H,W or features)
  total_ms: float
  fwd_ms: float | None  # None where the file gives only the total (*.txt)
  bwd_ms: float | None
  file: str
  line: int
  section: str = ""  # text of the last '#NAME' marker line before the row ("" if none)

  @property
  def template(self) -> str:
    """The row's key with the batch written as [b]."""
    p = json.dumps(self.params, separators=(",", ":"), sort_keys=True)
    d = f"[{','.join(map(str, self.dims))}]" if len(self.dims) != 1 else f"{self.dims[0]}"
    return f"{self.kind}{p}[b]{d}"


def parse_line(text: str, file: str, line: int, section: str = "") -> Row | None:
  """A Row, or None for totals, headers, section markers and blank lines."""
  fields = text.split()
  if not fields or fields[0].startswith(("#", "SUM(", "sum:")):
    return None
  m = _KEY.match(fields[0])
  nums = fields[1:]
  if m is None or not nums or not all(_NUMBER.match(x) for x in nums):
    raise UserError(f"{file}:{line}: cannot parse row '{text.strip()[:80]}'; expected "
                    "kind{json}[batch][dims] followed by numbers")
  try:
    params = json.loads(m["params"])
  except json.JSONDecodeError:
    raise UserError(f"{file}:{line}: the parameters of '{fields[0][:60]}' are not JSON") from None
  dims = tuple(int(x) for x in m["dims"].split(",")) if m["dims"] else (int(m["flat"]),)
  vals = [float(x) for x in nums]
  if file.endswith(".prof"):
    if len(vals) != 3:
      raise UserError(f"{file}:{line}: a .prof row needs total ms, forward us and backward us, "
                      f"got {len(vals)} numbers")
    total, fwd, bwd = vals[0], vals[1] / 1e3, vals[2] / 1e3
  else:
    # .txt: avg [p50 p90 p99]; the median resists the rare outliers these files hold
    total, fwd, bwd = (vals[1] if len(vals) >= 2 else vals[0]), None, None
  return Row(m["kind"], params, int(m["batch"]), dims, total, fwd, bwd, file, line, section)


def parse_file(path: str | Path) -> list[Row]:
  """Every layer row of one DeepPool file, in file order, with its section marker."""
  path = Path(path)
  try:
    lines = path.read_text().splitlines()
  except FileNotFoundError:
    raise UserError(f"DeepPool profile file not found: {path}") from None
  rows, section = [], ""
  for i, text in enumerate(lines, start=1):
    s = text.strip()
    if s.startswith("#") and not s.startswith("#config"):
      section = s[1:].strip()
      continue
    r = parse_line(text, path.name, i, section)
    if r is not None:
      rows.append(r)
  return rows


def move_relu_backward(rows: list[Row], relu_bwd_factor: float = 1.5) -> list[Row]:
  """Give back to a conv/linear row the backward time DeepPool recorded on its in-place ReLU.

  DeepPool's ReLUs run in place, so timing a ReLU's backward also runs the backward of the
  layer before it: the conv2d/linear row shows ~0 us backward and the ReLU row holds both.
  We keep relu_bwd_factor x the ReLU's forward time on the ReLU (its backward reads the output
  gradient and its output and writes the input gradient: 3 tensors to the forward's 2) and move
  the rest to the row before. Only .prof rows (with a forward/backward split) are changed.
  """
  out = list(rows)
  for i in range(1, len(out)):
    r, p = out[i], out[i - 1]
    if (r.kind in ("ReLU2d", "ReLU1d") and p.kind in ("conv2d", "linear") and r.batch == p.batch
        and r.bwd_ms is not None and p.bwd_ms is not None and r.fwd_ms is not None):
      keep = min(r.bwd_ms, relu_bwd_factor * r.fwd_ms)
      moved = r.bwd_ms - keep
      out[i] = replace(r, bwd_ms=keep)
      out[i - 1] = replace(p, bwd_ms=p.bwd_ms + moved)
  return out
