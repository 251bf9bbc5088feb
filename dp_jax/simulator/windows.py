"""Device classes (devices whose foreground work is identical) and their idle windows.

Every task covers device ranges, so devices between two consecutive range boundaries see the
same tasks: one class stands for all of them, which keeps a 1024-device simulation small. A
window is a time when neither stream of a class has foreground work. The time after a class's
last task and before its first task of the next iteration is one window ("wrap").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dp_jax.simulator.timeline import Timeline

EPS_MS = 1e-9


@dataclass(frozen=True, eq=False)
class DeviceClasses:
  """Class k holds devices [bounds[k], bounds[k + 1]); tasks[k]: its task ids by start."""

  bounds: np.ndarray
  tasks: tuple[np.ndarray, ...]

  @property
  def sizes(self) -> np.ndarray:
    return np.diff(self.bounds)

  def __len__(self) -> int:
    return len(self.bounds) - 1

  def of_device(self, device: int) -> int:
    return int(np.searchsorted(self.bounds, device, side="right") - 1)


@dataclass(frozen=True)
class Window:
  """Idle time of one class under the alone schedule."""

  cls: int
  start_ms: float
  length_ms: float
  opener: int  # task whose end opens the window; -1: the class has no foreground work
  closers: tuple[int, ...]  # tasks that start when it ends
  wrap: bool  # from the class's last task to its first task of the next iteration


def device_classes(tl: Timeline) -> DeviceClasses:
  """Group devices by the set of tasks that cover them."""
  cuts = {0, tl.num_devices}
  for t in tl.tasks:
    for s, c in t.spans:
      cuts.update((s, s + c))
  bounds = np.array(sorted(cuts), dtype=np.int64)
  members: list[list[int]] = [[] for _ in range(len(bounds) - 1)]
  for i, t in enumerate(tl.tasks):
    for s, c in t.spans:
      lo, hi = np.searchsorted(bounds, [s, s + c])
      for k in range(lo, hi):
        members[k].append(i)
  tasks = []
  for ids in members:
    ids_arr = np.array(sorted(set(ids)), dtype=np.int64)
    order = np.lexsort((ids_arr, tl.start_ms[ids_arr])) if len(ids_arr) else ids_arr
    tasks.append(ids_arr[order])
  return DeviceClasses(bounds, tuple(tasks))


def busy_intervals(tl: Timeline, ids: np.ndarray) -> list[tuple[float, float, list[int]]]:
  """Merged (start, end, task ids) intervals when any of the given tasks runs."""
  out: list[tuple[float, float, list[int]]] = []
  for i in ids:
    s, e = float(tl.start_ms[i]), float(tl.end_ms[i])
    if out and s <= out[-1][1] + EPS_MS:
      out[-1] = (out[-1][0], max(out[-1][1], e), out[-1][2] + [int(i)])
    else:
      out.append((s, e, [int(i)]))
  return out


def busy_ms(tl: Timeline, classes: DeviceClasses) -> np.ndarray:
  """(classes,) foreground-busy time of one device of each class (either stream)."""
  return np.array([sum(e - s for s, e, _ in busy_intervals(tl, ids)) for ids in classes.tasks])


def idle_windows(tl: Timeline, classes: DeviceClasses) -> list[Window]:
  """Every idle window of every class, by class then time (a class's wrap window last)."""
  period = tl.iteration_ms
  out: list[Window] = []
  for k, ids in enumerate(classes.tasks):
    spans = busy_intervals(tl, ids)
    if not spans:
      out.append(Window(k, 0.0, period, -1, (), True))
      continue
    for (_, e0, a), (s1, _, b) in zip(spans, spans[1:], strict=False):
      if s1 - e0 > EPS_MS:
        out.append(Window(k, e0, s1 - e0, _last(tl, a), _first(tl, b), False))
    tail = period - spans[-1][1] + spans[0][0]
    if tail > EPS_MS:
      out.append(Window(k, spans[-1][1], tail, _last(tl, spans[-1][2]), _first(tl, spans[0][2]),
                        True))
  return out


def _last(tl: Timeline, ids: list[int]) -> int:
  return max(ids, key=lambda i: (tl.end_ms[i], i))


def _first(tl: Timeline, ids: list[int]) -> tuple[int, ...]:
  s = min(tl.start_ms[i] for i in ids)
  return tuple(i for i in ids if tl.start_ms[i] <= s + EPS_MS)
