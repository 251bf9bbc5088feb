"""Mixture-of-experts layers in the runtime: expert parallelism and dropped-token counts.

Split "experts" (dp_jax/planner/sharding.py) runs a moe_experts layer (dp_jax/models/moe.py
Experts) on its (d, m) mesh with the routed experts' stacked weights split over "model"
([MODEL, None, None]: device (i, j) holds experts j E/m .. (j + 1) E/m - 1) and the tokens of
the layer's samples split over all d m devices (sequence range i m + j on device (i, j),
PartitionSpec(("data", "model")), as `sample_ranges(..., "experts")` says). Routing, dispatch
and combine run on each device's own sequences; the dispatched slots go to the experts' devices
and back as two all-to-alls over "model" (jax.shard_map with jax.lax.all_to_all:
moe.moe_ffn_all_to_all). The shared experts (replicated weights) run on the token-split tokens
under GSPMD. Capacity is per sequence as the model computes it, so the layer's output equals the
unsplit layer's (and, when it drops, drops the same assignments). The routed weights'
gradients come out of the shard_map split over "model" and summed over "data".

`dropped` counts the assignments a layer drops by capacity (moe.dropped_assignments) for the
step's metrics; None where the capacity holds every assignment (C = T).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from dp_jax.base.errors import UserError
from dp_jax.models import moe
from dp_jax.runtime.functional import Arrays, LayerDef, layer_stats, merge_layer
from dp_jax.runtime.mesh import BATCH_AXIS, MODEL_AXIS

TOKENS = PartitionSpec((BATCH_AXIS, MODEL_AXIS))  # sequences over every device of the mesh
EXPERTS = PartitionSpec(MODEL_AXIS)  # stacked expert weights: their leading axis over "model"
ROUTED = ("w_gate", "w_up", "w_down")


def apply_expert_parallel(mesh: Mesh, d: LayerDef, params: Arrays, stats: Arrays,
                          args: Sequence[Any]):
  """Layer `d` (a moe.Experts) with its routed experts split over `mesh`'s "model" axis and its
  tokens over both axes: (output, new stats), as functional.apply_layer returns them. The
  residual and shared-expert sum is moe.Experts.__call__'s, with the routed experts' term
  computed by moe.moe_ffn_all_to_all."""
  module = merge_layer(d, params, stats)
  if not isinstance(module, moe.Experts):
    raise UserError(f"plan layer '{d.name}' uses split 'experts', which runs only a "
                    f"mixture-of-experts layer (moe_experts), not {type(module).__name__}; "
                    "use another split for it")
  m = mesh.shape[MODEL_AXIS]
  if module.n_expert % m:
    raise UserError(f"plan layer '{d.name}': split 'experts' over a model axis of {m} devices "
                    f"needs n_expert ({module.n_expert}) divisible by {m}")
  h_BxTxD, routed_BxTxR = args
  x_BxTxD, gates_BxTxE = module.split(routed_BxTxR)
  cap = module.capacity(h_BxTxD.shape[1])
  routed = jax.shard_map(
      functools.partial(moe.moe_ffn_all_to_all, top_k=module.top_k, cap=cap,
                        axis_name=MODEL_AXIS),
      mesh=mesh, in_specs=(TOKENS, TOKENS, EXPERTS, EXPERTS, EXPERTS), out_specs=TOKENS)
  y_BxTxD = routed(x_BxTxD, gates_BxTxE, *(params[k] for k in ROUTED))
  if module.shared is not None:
    y_BxTxD = y_BxTxD + module.shared(x_BxTxD)
  return h_BxTxD + y_BxTxD, layer_stats(d, module)


def dropped(d: LayerDef, params: Arrays, stats: Arrays, args: Sequence[Any]) -> jax.Array | None:
  """Assignments layer `d` drops by capacity in this batch (a scalar), if it is a moe.Experts
  layer whose capacity can drop any (C < T); else None."""
  module = merge_layer(d, params, stats)
  if not isinstance(module, moe.Experts):
    return None
  tokens = args[0].shape[1]
  if module.capacity(tokens) >= tokens:
    return None
  return jnp.sum(module.dropped(args[1]))

