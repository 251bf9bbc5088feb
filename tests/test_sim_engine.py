"""simulate() checks that a plan matches the model, cluster and options it is simulated with."""

import math
from dataclasses import replace

import pytest
from sim_helpers import cluster, graph, plan, profile

from dp_jax.base.errors import UserError
from dp_jax.planner.baseline import cost_model_for
from dp_jax.planner.contract import Plan
from dp_jax.simulator.engine import default_switch_ms, simulate


def test_options_round_trip_through_the_plan():
  p = plan("resnet", 8, 32, math.inf, False)
  again = Plan.from_json(p.to_json())
  for opts in (p.plan_options, again.plan_options):  # typed, as the plan was made
    assert opts.amplification_limit == math.inf and opts.overlap_allreduce is False
    assert (opts.num_devices, opts.global_batch) == (8, 32)
  assert again.options == p.options and again.to_json()["options"] == p.to_json()["options"]
  assert p.to_json()["options"]["amplification_limit"] is None  # as plans always wrote it


def test_plan_for_another_model_or_cluster_is_an_error():
  p = plan("resnet", 8, 32)
  with pytest.raises(UserError, match="pass model=resnet_like"):
    cost_model_for(graph("inception"), profile("inception", 32), cluster(), p)
  other = replace(cluster(), name="elsewhere")
  with pytest.raises(UserError, match="pass cluster=dgx_a100"):
    simulate(graph("resnet"), profile("resnet", 32), other, p)


def test_switch_defaults_to_one_kernel_overhead():
  assert default_switch_ms(cluster()) == pytest.approx(0.005)


def test_the_simulator_does_not_import_jax():
  import subprocess
  import sys

  code = ("import sys, dp_jax.simulator.engine, dp_jax.simulator.metrics, dp_jax.simulator.gantt; "
          "assert 'jax' not in sys.modules, 'jax imported'")
  subprocess.run([sys.executable, "-c", code], check=True)
