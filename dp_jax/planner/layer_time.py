"""A layer's time as its parts: the one definition of how compute, update, synchronisation and
a weight split's collectives make up what a layer costs in a step, and which of it is backward.

Every pricing path builds its layer times here: the cost model's per-count arrays
(costs.build_cost_model), the search's tables with batch-norm synchronisation per link class
(search.tables), a layer at a placement and sharding (pricing.layer_time, which the search,
evaluate, the plan's per-layer entries and the simulator call), and the background job's pieces
(simulator.job). The arithmetic broadcasts, so the same function prices one layer or every
(layer, count) at once. Pure Python and numpy: no JAX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LayerTime:
  """One layer's step on its devices, in ms (floats or numpy arrays that broadcast).

  forward, backward: its compute at the per-device batch (at the sharded shape when its
  weights are split; backward includes one more forward when the layer recomputes its
  activations); update: the optimizer update of the share of parameters each device holds;
  sync: one batch-norm statistics all-reduce over its devices (paid once in forward and once in
  backward); moves_forward, moves_backward: a weight split's activation collectives (the entry
  gather and the split's own).
  """

  forward: Any
  backward: Any
  update: Any = 0.0
  sync: Any = 0.0
  moves_forward: Any = 0.0
  moves_backward: Any = 0.0

  @property
  def total(self) -> Any:
    """Everything the layer costs in a step (its gradient all-reduce is the stage's)."""
    return (self.forward + self.backward + self.update + 2 * self.sync + self.moves_forward
            + self.moves_backward)

  @property
  def backward_total(self) -> Any:
    """What of it runs in the backward pass (where the stage's all-reduce overlaps)."""
    return self.backward + self.sync + self.moves_backward

  @property
  def forward_total(self) -> Any:
    """What of it runs in the forward pass (what a recomputation repeats)."""
    return self.forward + self.sync + self.moves_forward


def compose(forward: Any, backward: Any, update: Any = 0.0, *, sync: Any = 0.0,
            moves: tuple[Any, Any] = (0.0, 0.0), ratios: tuple[Any, Any] = (1.0, 1.0),
            recompute: bool = False) -> LayerTime:
  """A layer's time from the profile's forward and backward at its per-device batch: scaled by
  `ratios` (the sharded shape's compute over the whole layer's), with its update, batch-norm
  `sync` and a split's `moves` (forward, backward); `recompute`: the backward repeats the whole
  forward (compute, synchronisation and collectives), as jax.checkpoint runs it."""
  t = LayerTime(forward * ratios[0], backward * ratios[1], update, sync, moves[0], moves[1])
  if recompute:
    t = LayerTime(t.forward, t.backward + t.forward_total, t.update, t.sync, t.moves_forward,
                  t.moves_backward)
  return t
