"""Interleaved timing of several plans on the runtime."""

import jax

from dp_jax.models.registry import build_model
from dp_jax.runtime.plan_timing import time_plans
from dp_jax.runtime.plans import data_parallel_layout_plan, layout_plan
from dp_jax.runtime.stages import structure_graph


def test_time_plans_runs_each_plan_and_counts_stages():
  def build():
    return build_model("gpt2_small", n_layer=1, d_model=32, n_head=2, seq_len=8, vocab_size=64)

  graph = structure_graph(build(), "gpt2_small")
  dp = data_parallel_layout_plan(graph, global_batch=4, num_devices=2)
  split = layout_plan(graph, lambda n: [0] if n == graph.names[-1] else [0, 1], global_batch=4,
                      num_devices=2)
  seen = []
  out = time_plans(build, graph, [dp, split], jax.devices()[:2], steps=2, warmup=1, group=1,
                   progress=seen.append)
  assert [t.stages for t in out] == [1, 2]
  assert all(len(t.step_ms) == 2 and t.ms("min") <= t.ms("median") for t in out)
  assert out[0].loss == out[0].loss and len(seen) == 2  # finite loss; one report per group
