"""A worker of the multi-process tests: joins jax.distributed, runs one case, process 0 saves.

python mp_worker.py transfer|train <out.npz>
python mp_worker.py loop - <heartbeat_timeout_s>   (all-reduces until a peer dies)
"""

from __future__ import annotations

import sys

import numpy as np

from dp_jax.runtime import distributed

# (source, target, kind): batch-sharded -> batch | replicated; tied: replicated -> replicated
MOVES = [("p0", "p1", "batch"), ("all", "span", "batch"), ("span", "one", "replicated"),
         ("one", "p0", "batch"), ("p1", "rev", "batch"), ("one", "all", "tied")]


def transfer_case() -> dict[str, np.ndarray]:
  """Moves between device sets on one, the other and both processes; each result read back."""
  import jax
  import jax.numpy as jnp

  from dp_jax.runtime import mesh as meshlib
  from dp_jax.runtime import transfer

  devs = jax.devices()
  sets = {"p0": devs[:4], "p1": devs[4:], "all": devs, "span": devs[2:6], "one": [devs[5]],
          "rev": devs[::-1]}
  everywhere = transfer.replicated_everywhere(devs)
  x_np = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  out = {}
  for a, b, kind in MOVES:
    m_a, m_b = meshlib.stage_mesh(sets[a]), meshlib.stage_mesh(sets[b])
    src = meshlib.batch_sharding(m_a) if kind != "tied" else meshlib.replicated(m_a)
    dst = meshlib.batch_sharding(m_b) if kind == "batch" else meshlib.replicated(m_b)
    x = jax.jit(lambda: jnp.asarray(x_np), out_shardings=src)()
    y = transfer.move(x, dst)
    assert y.sharding == dst, (a, b, kind)
    out[f"{a}->{b}:{kind}"] = transfer.local_value(y, everywhere)
  return out


def agreement_case() -> dict[str, np.ndarray]:
  """Each process plans differently; every process runs process 0's plan (train.py)."""
  import logging

  import jax

  from dp_jax.planner.contract import Plan
  from dp_jax.train import same_plan_everywhere

  def plan(devices: list[int], batch: int = 8, **extra) -> Plan:
    return Plan.from_json({"model": "m", "global_batch": batch, "num_devices": 2,
                           "layers": [{"name": "x", "devices": devices}], **extra},
                          planned=False)

  rank = jax.process_index()
  warnings = []
  handler = logging.Handler()
  handler.emit = warnings.append
  logging.getLogger("dp_jax.train").addHandler(handler)
  agreed = same_plan_everywhere(plan(list(range(rank + 1)), 8 * (rank + 1), planned_by=rank))
  expected = plan([0], planned_by=0)
  assert agreed == expected, f"process {rank} got {agreed}"
  assert len(warnings) == rank, "process 1 says that its own plan differed"
  timed = same_plan_everywhere(plan([0], planner_seconds=0.01 * (rank + 1)))
  assert timed.planner_seconds == 0.01
  assert len(warnings) == rank, "the planner's wall time alone is no difference"
  assert str(distributed.shared_dir(f"/tmp/run_of_{rank}")) == "/tmp/run_of_0"
  return {"agreed_batch": np.array(agreed.global_batch)}


def train_case() -> dict[str, np.ndarray]:
  """Tiny GPT-2 under the 8 / 4 / 1 device plan of test_multiprocess for 3 steps."""
  import jax
  from mp_layouts import train_multiprocess_layout
  from runtime_helpers import batches, make_model, sgd

  from dp_jax.planner.contract import check_plan, layout_plan
  from dp_jax.runtime.functional import split_layers
  from dp_jax.runtime.stages import structure_graph
  from dp_jax.runtime.step import build_program, init_state, train_step

  model = make_model("gpt2")
  data = batches(model, 8, 3)
  graph = structure_graph(model, "gpt2")
  plan = layout_plan(graph, train_multiprocess_layout, global_batch=8, num_devices=8)
  checked = check_plan(plan, graph, available_devices=len(jax.devices()))
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, checked, sgd(), jax.devices())
  state = init_state(program, params, stats, sgd())
  losses = []
  for x, y in data:
    xs = _host(x, program.input_stage.batch)
    ys = _host(y, program.last_stage.batch)
    state, loss = train_step(program, state, xs, ys)
    losses.append(float(program.value(loss)))
  out = {"losses": np.array(losses)}
  for layer, p in state["params"].items():
    for key, leaf in jax.tree_util.tree_flatten_with_path(p)[0]:
      out[f"{layer}{jax.tree_util.keystr(key)}"] = program.value(leaf)
  return out


def loop_case() -> None:
  """All-reduce across both processes until a peer dies; errors end as one line, like the apps."""
  import time

  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  mesh = Mesh(np.array(jax.devices()), ("d",))
  total = jax.jit(lambda x: x.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))
  x = jax.make_array_from_callback((len(jax.devices()),), NamedSharding(mesh, PartitionSpec("d")),
                                   lambda i: np.ones(1, np.float32))
  total(x).block_until_ready()
  print(f"process {jax.process_index()} ready", flush=True)
  try:
    while True:
      total(x).block_until_ready()
      time.sleep(0.05)
  except Exception as e:  # noqa: BLE001 - as dp_jax.cli.hydra_app does
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    sys.exit(2)


def _host(a: np.ndarray, sharding):
  import jax

  return jax.make_array_from_callback(a.shape, sharding, lambda i: a[i], dtype=a.dtype)


def main() -> None:
  case, path = sys.argv[1], sys.argv[2]
  if case == "loop":
    distributed.initialize(distributed.DistributedConfig(heartbeat_timeout_s=int(sys.argv[3])))
    return loop_case()
  distributed.initialize()
  import jax

  out = {"transfer": transfer_case, "train": train_case}[case]()
  if case == "transfer":
    out.update(agreement_case())  # a few more collectives on the same two processes
  if jax.process_index() == 0:
    np.savez(path, **out)
  print(f"process {jax.process_index()} done", flush=True)


if __name__ == "__main__":
  main()
