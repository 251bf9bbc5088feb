"""Read the records of an offline W&B run file (run-<id>.wandb), as `wandb sync` would."""

import struct
from pathlib import Path

HEADER = 7  # ":W&B" ident, a 2-byte magic, a version byte
BLOCK = 32768  # LevelDB-style log blocks; each chunk: crc32 (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list:
  """Every protobuf Record of the file, in order."""
  from wandb.proto import wandb_internal_pb2

  data = Path(path).read_bytes()
  assert data[:4] == b":W&B", f"{path} is not a W&B run file"
  out, pos, pending = [], HEADER, b""
  while pos + 7 <= len(data):
    left = BLOCK - pos % BLOCK
    if left < 7:
      pos += left
      continue
    _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
    if kind == 0 and length == 0:
      pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
      continue
    if kind in (FULL, FIRST):
      pending = chunk
    else:
      pending += chunk
    if kind in (FULL, LAST):
      rec = wandb_internal_pb2.Record()
      rec.ParseFromString(pending)
      out.append(rec)
  return out


def run_file(folder: Path) -> Path:
  """The one offline run file under a job's folder."""
  files = sorted(Path(folder).glob("wandb/offline-run-*/run-*.wandb"))
  assert len(files) == 1, files
  return files[0]
