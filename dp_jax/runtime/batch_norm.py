"""Batch-norm statistics as the plan says: over a stage's whole batch, or per device.

batch_norm=sync (the default): a stage's batch norm normalizes by statistics of the stage's
whole batch (jax.jit over the sub-mesh all-reduces them), so any plan trains exactly like one
device. batch_norm=local: each device normalizes its own samples by their own statistics, as
PyTorch DDP does without SyncBatchNorm; the result then depends on each layer's device count.
"""

from __future__ import annotations

from dp_jax.planner.contract import Plan


def batch_norm_mode(plan: Plan) -> str:
  """The plan's batch_norm option (its planner options, checked when it was read), "sync"
  when it records none."""
  return "sync" if plan.options is None else plan.options.batch_norm


def set_statistics_groups(model, plan: Plan) -> None:
  """Give every batch-norm layer of `model` one statistics group per sample range of its layer
  in the plan (local: one per device along its "data" axis), or one for its whole batch
  (sync)."""
  local = batch_norm_mode(plan) == "local"
  groups = {lp.name: lp.mesh[0] for lp in plan.layers}  # data axis: devices with own samples
  for spec in model.layer_specs():
    if hasattr(spec.module, "stats_groups"):
      spec.module.stats_groups = groups.get(spec.name, 1) if local else 1
