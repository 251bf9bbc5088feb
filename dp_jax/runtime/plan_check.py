"""Check a plan against a model's graph and the local devices, one-line errors.

The plan is parsed by the one plan parser (dp_jax/planner/plan.py, `Plan.from_json`); this
adds what needs the model and the devices: the layers are the model's, each layer's split is
one its kind allows, the plan's devices exist and its batch is the job's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dp_jax.errors import UserError
from dp_jax.graph import LayerGraph
from dp_jax.planner.plan import Plan, as_plan
from dp_jax.sharding import splits_for


def plan_dict(plan: Any) -> dict[str, Any]:
  """The plan as a JSON dict (accepts a dict or a Plan), for writing and sending."""
  if isinstance(plan, Mapping):
    return dict(plan)
  return as_plan(plan).to_json()


def check_plan(plan: Any, graph: LayerGraph, *, available_devices: int,
               global_batch: int | None = None) -> Plan:
  """`plan` (a Plan or plan JSON) checked for `graph` on `available_devices`, its layers in
  graph order; raise UserError on the first problem."""
  p = as_plan(plan)
  if p.model != graph.model:
    raise UserError(f"plan is for model '{p.model}' but the model is '{graph.model}'; "
                    f"make a plan for {graph.model}")
  batch, g = p.global_batch, p.num_devices
  if global_batch is not None and global_batch != batch:
    raise UserError(f"plan was made for global batch {batch} but the batch size is "
                    f"{global_batch}; set batch_size={batch} or make a plan for {global_batch}")
  if g > available_devices:
    raise UserError(f"plan needs {g} devices but only {available_devices} are available; "
                    f"make a plan for {available_devices} devices or add devices")
  _check_names([lp.name for lp in p.layers], graph)
  for lp in p.layers:
    node = graph.node(lp.name)
    m = lp.mesh[1]
    if lp.split not in splits_for(node, m):
      raise UserError(f"plan layer '{lp.name}' ({node.kind}) cannot use split '{lp.split}' on "
                      f"a model axis of {m}")
  return p.in_order(graph.names)


def _check_names(names: list[str], graph: LayerGraph) -> None:
  seen = set(names)
  missing = [n for n in graph.names if n not in seen]
  unknown = [n for n in names if n not in set(graph.names)]
  if missing or unknown:
    parts = []
    for label, items in (("missing", missing), ("unknown", unknown)):
      if items:
        more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
        parts.append(f"{label}: {', '.join(map(str, items[:3]))}{more}")
    raise UserError(f"plan layers do not match model {graph.model} ({'; '.join(parts)}); "
                    f"make the plan for this model and size")
