"""validate and the main job predict with the planner's own evaluation
(dp_jax.measurement.local.predicted_step): a plan's predicted time is validate's."""

import dataclasses
import math

import numpy as np
import pytest
from test_planner_stage_terms import mlp

from dp_jax.base.checks import build
from dp_jax.hardware.cluster import ClusterConfig, cluster_file
from dp_jax.measurement.local import layout_plans, predicted_step
from dp_jax.measurement.local_links import LocalCalibration
from dp_jax.planner import PlanOptions, plan_with
from dp_jax.planner.synthetic import linear_profile


def calibration(g: int) -> LocalCalibration:
  return LocalCalibration(num_devices=g, cores=g, transfer_GBps=4.0, transfer_latency_us=60.0,
                          allreduce_GBps=3.0, allreduce_latency_us=40.0, dispatch_us=120.0,
                          stage_us=1500.0, update_ns_per_param=2.5, points={})


def in_context_like(graph, batch, counts):
  """A profile with what the in-context profile records: boundary costs per per-device batch
  and cut, the update and all-reduce inside its timings."""
  profile = linear_profile(graph, [batch // c for c in counts], np.random.default_rng(3))
  table = {str(batch // c): {"1": 0.3 * c, "3": 0.9, "4": 0.5} for c in counts}
  return dataclasses.replace(profile, meta={"boundary_ms": table, "includes_update": True,
                                            "includes_allreduce": True})


@pytest.mark.parametrize("includes", [True, False])
def test_plan_prediction_is_validates_prediction(includes):
  g, b = 2, 8
  graph = mlp(widths=(32, 64, 64, 64, 64, 10))
  profile = in_context_like(graph, b, (1, 2))
  if not includes:  # the loaded profile: update and all-reduce priced from the calibration
    profile = dataclasses.replace(profile, meta={"boundary_ms": profile.meta["boundary_ms"]})
  base = build(ClusterConfig, cluster_file("local_cpu"))
  cluster = calibration(g).cluster(base)
  opts = PlanOptions(num_devices=g, global_batch=b, overlap_allreduce=False,
                     amplification_limit=math.inf)
  plans = [plan_with(graph, profile, cluster, dataclasses.replace(opts, name="data_parallel")),
           plan_with(graph, profile, cluster, opts)]
  staged = {n: ((0, 2) if i < 3 else (0, 1)) for i, n in enumerate(graph.names)}
  for plan in plans:
    got = predicted_step(graph, profile, cluster, opts, plan)
    assert got["predicted_ms"] == pytest.approx(plan.predicted["iteration_ms"], rel=1e-12)
  (staged_plan,) = layout_plans(graph, [staged], global_batch=b, num_devices=g)
  got = predicted_step(graph, profile, cluster, opts, staged_plan)
  # what validate added before the cost model priced it: one dispatch, stage_us per added
  # stage, the boundary's mean cost at k = 3 over both stages' batches (4 and 8)
  cal = calibration(g)
  assert got["stages"] == 2
  assert got["overhead_ms"] == pytest.approx((cal.dispatch_us + cal.stage_us) / 1e3
                                             + (0.9 + 0.9) / 2)
  assert got["boundary_ms"] == pytest.approx(0.9)
  params = sum(n.params for n in graph.nodes)
  if includes:
    assert got["sync_ms"] == 0 and got["update_ms"] == 0
  else:  # the calibrated momentum update: params x update_ns_per_param, per stage's devices
    assert got["sync_ms"] > 0
    assert got["update_ms"] == pytest.approx(params * cal.update_ns_per_param / 1e6)
