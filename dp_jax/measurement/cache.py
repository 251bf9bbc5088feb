"""On-disk cache of measured layer timings: one small JSON file per (layer, batch, device) key.

A key holds what a timing depends on: the device, backend and JAX version, the batch, the
layer's input shapes and its traced content (layer_hash: kind, attrs, parameters, output shape,
FLOPs and bytes, all traced from the model's current source), so an edited layer is measured
again rather than read back.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_CACHE_DIR = Path(".cache/dp_jax/profiles")
CACHE_SCHEMA = "dp_jax.profile_cache/1"


def attrs_hash(attrs: Mapping[str, Any]) -> str:
  """Stable short hash of a layer's attrs (sorted-key JSON)."""
  blob = json.dumps(attrs, sort_keys=True, default=str, separators=(",", ":"))
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def layer_hash(node: Any) -> str:
  """Stable short hash of what a layer's timing depends on in its graph node (a LayerNode):
  everything traced from its code but its name and wiring (equal layers share timings)."""
  d = node.to_json()
  return attrs_hash({k: v for k, v in d.items() if k not in ("name", "inputs")})


def _path(cache_dir: Path, key: Mapping[str, Any]) -> Path:
  blob = json.dumps(key, sort_keys=True, separators=(",", ":"))
  digest = hashlib.sha256(blob.encode()).hexdigest()[:24]
  model = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(key.get("model", "x")))
  return cache_dir / model / f"{digest}.json"


def _read(cache_dir: str | Path, key: Mapping[str, Any]) -> dict[str, Any] | None:
  """The cache file of `key` as a dict, or None (absent, unreadable or another key's file)."""
  path = _path(Path(cache_dir), key)
  try:
    d = json.loads(path.read_text())
  except (FileNotFoundError, json.JSONDecodeError, OSError):
    return None
  if not isinstance(d, dict) or d.get("schema") != CACHE_SCHEMA or d.get("key") != dict(key):
    return None
  return d


def load(cache_dir: str | Path, key: Mapping[str, Any]) -> tuple[float, float] | None:
  """Cached (fwd_ms, bwd_ms) for `key`, or None (absent, unreadable or another key's file)."""
  d = _read(cache_dir, key)
  if d is None:
    return None
  f, w = d.get("fwd_ms"), d.get("bwd_ms")
  if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in (f, w)):
    return None
  return float(f), float(w)


def store(cache_dir: str | Path, key: Mapping[str, Any], fwd_ms: float, bwd_ms: float) -> Path:
  """Write one entry atomically (temporary file, then rename)."""
  path = _path(Path(cache_dir), key)
  path.parent.mkdir(parents=True, exist_ok=True)
  body = json.dumps({"schema": CACHE_SCHEMA, "key": dict(key), "fwd_ms": fwd_ms,
                     "bwd_ms": bwd_ms}, indent=1, sort_keys=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
  with os.fdopen(fd, "w") as f:
    f.write(body)
  os.replace(tmp, path)
  return path


def load_entry(cache_dir: str | Path, key: Mapping[str, Any]) -> dict[str, Any] | None:
  """A cached JSON object stored by store_entry for `key`, or None."""
  d = _read(cache_dir, key)
  return d.get("value") if d is not None and isinstance(d.get("value"), dict) else None


def store_entry(cache_dir: str | Path, key: Mapping[str, Any], value: Mapping[str, Any]) -> Path:
  """Write one JSON object for `key` atomically."""
  path = _path(Path(cache_dir), key)
  path.parent.mkdir(parents=True, exist_ok=True)
  body = json.dumps({"schema": CACHE_SCHEMA, "key": dict(key), "value": dict(value)}, indent=1,
                    sort_keys=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
  with os.fdopen(fd, "w") as f:
    f.write(body)
  os.replace(tmp, path)
  return path
