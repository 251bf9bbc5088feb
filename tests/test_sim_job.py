"""Background jobs: pieces of a step, their total, memory from the planner's model."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import cluster, graph, profile

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import flat_layers
from dp_jax.multiplex.policy import layer_groups
from dp_jax.planner import memory
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.options import PlanOptions
from dp_jax.simulator.job import background_job, check_memory


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3), st.floats(0, 3)), min_size=1, max_size=40),
       st.floats(0.05, 2))
def test_groups_cover_every_layer_in_order_and_respect_the_size(times, piece_ms):
  fwd, bwd = [f for f, _ in times], [b for _, b in times]
  groups = layer_groups([str(i) for i in range(len(times))], fwd, bwd, piece_ms)
  assert [i for g in groups for i in g] == list(range(len(times)))
  for g in groups:
    assert len(g) == 1 or (sum(fwd[i] for i in g) <= piece_ms
                           and sum(bwd[i] for i in g) <= piece_ms)


def test_a_step_is_the_profiled_forward_and_backward_in_runtime_order():
  g, prof = graph("resnet"), profile("resnet", 32)
  job = background_job(g, prof, cluster(), 8, piece_ms=0.5)
  model = build_cost_model(g, prof, cluster(), PlanOptions(num_devices=1, global_batch=8,
                                                           amplification_limit=math.inf))
  update = float(model.update_ms.sum())  # the job updates its whole model on its device
  assert update > 0
  assert job.step_ms == pytest.approx(prof.iteration_ms(8, list(g.names)) + update)
  n = len(job.groups)
  assert n > 1 and len(job.pieces_ms) == 2 * n - 1
  assert job.piece_names[n - 1] == f"fwd_bwd:{n - 1}" and job.piece_names[-1] == "bwd:0"
  assert [x for grp in job.groups for x in grp] == list(flat_layers(g.decompose()))


def test_memory_is_the_planner_model_on_one_device():
  g, prof = graph("resnet"), profile("resnet", 32)
  job = background_job(g, prof, cluster(), 8)
  model = build_cost_model(g, prof, cluster(), PlanOptions(num_devices=1, global_batch=8,
                                                           amplification_limit=math.inf))
  one = {n: (0, 1) for n in g.names}
  assert job.memory_bytes == pytest.approx(memory.device_bytes(model, one)[0])
  assert job.memory_bytes > g.total_param_bytes * 3  # params + grads + momentum


def test_memory_overflow_is_one_clear_error():
  job = background_job(graph("resnet"), profile("resnet", 32), cluster(), 8)
  capacity = 40e9
  check_memory(job, np.full(8, capacity - job.memory_bytes - 1), capacity)
  used = np.zeros(8)
  used[5] = capacity - job.memory_bytes / 2
  with pytest.raises(UserError, match=r"device 5 has only .* GB free.*batch_per_device"):
    check_memory(job, used, capacity)


@pytest.mark.parametrize("batch, piece", [(0, 0.5), (-1, 0.5), (8, 0), (8, -1.0), (2.5, 0.5)])
def test_bad_settings_are_user_errors(batch, piece):
  with pytest.raises(UserError):
    background_job(graph("resnet"), profile("resnet", 32), cluster(), batch, piece_ms=piece)
