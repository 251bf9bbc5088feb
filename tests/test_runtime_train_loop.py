"""train(): resume equals an uninterrupted run, metrics and timeline files, safe failures."""

import hashlib
import json
import shutil

import jax
import numpy as np
import optax
import pytest
from runtime_helpers import TINY_GPT2

from dp_jax.base.errors import UserError
from dp_jax.models.zoo import build_model
from dp_jax.planner.contract import check_plan, data_parallel_layout_plan, layout_plan
from dp_jax.runtime import data as datalib
from dp_jax.runtime.stages import structure_graph
from dp_jax.runtime.train_loop import train

LAYOUT = {"embed": [0, 1, 2, 3], "h.0": [0, 1, 2, 3], "h.1": [4, 5], "ln_f": [4, 5],
          "lm_head": [6, 7]}


def run(tmp, steps, layout=LAYOUT, name="gpt2_small", **kw):
  model = build_model(name, **TINY_GPT2)
  graph = structure_graph(model, name)
  plan = check_plan(layout_plan(graph, layout, global_batch=8, num_devices=8), graph,
                    available_devices=8)
  return train(model, graph, plan, steps=steps, optimizer=optax.adam(1e-2),
               data=datalib.synthetic(model, seed=7), checkpoint_dir=tmp / "ckpt",
               checkpoint_every=2, **kw)


def folder_digest(path):
  h = hashlib.sha256()
  for f in sorted(p for p in path.rglob("*") if p.is_file()):
    h.update(str(f.relative_to(path)).encode() + f.read_bytes())
  return h.hexdigest()


@pytest.fixture(scope="module")
def full(tmp_path_factory):
  """An uninterrupted 5-step run (folder, result, logged metrics), shared by the tests."""
  tmp = tmp_path_factory.mktemp("full")
  logged = []
  return tmp, run(tmp, 5, log_fn=lambda m, s: logged.append((s, m))), logged


def copy_checkpoints(src, dst):
  shutil.copytree(src / "ckpt", dst / "ckpt")
  return dst / "ckpt"


def test_resumed_run_ends_like_an_uninterrupted_one(tmp_path, full):
  folder, full, logged = full
  part = run(tmp_path / "part", 3)
  rest = run(tmp_path / "part", 5)
  assert rest.start_step == 3 and rest.final_step == 5
  np.testing.assert_array_equal(part.losses + rest.losses, full.losses)
  for a, b in zip(jax.tree.leaves(full.state), jax.tree.leaves(rest.state), strict=True):
    np.testing.assert_array_equal(a, b)
  assert [s for s, _ in logged] == [1, 2, 3, 4, 5] and "train/loss" in logged[0][1]
  lines = [json.loads(x) for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
  assert [x["step"] for x in lines] == [1, 2, 3, 4, 5]
  assert set(lines[1]["stage_ms"]) == {"0", "1", "2"}  # the timed step
  assert sorted(p.name for p in (folder / "ckpt").iterdir()) == [
      "4", "5", "dp_jax_checkpoint.json"]


def test_timeline_of_the_timed_step(full):
  r = full[1]
  t = json.loads(r.timeline_path.read_text())
  assert t["step"] == 3 and [s["devices"] for s in t["stages"]] == [[0, 1, 2, 3], [4, 5], [6, 7]]
  kinds = [(e["label"].split()[1], e["kind"]) for e in t["alone"]["events"] if e["kind"] != "move"]
  assert kinds == [("0", "fwd"), ("1", "fwd"), ("2", "bwd"), ("1", "bwd"), ("0", "bwd")]
  ends = [e["end_ms"] for e in t["alone"]["events"]]
  assert ends == sorted(ends) and t["alone"]["iteration_ms"] == ends[-1]


def test_train_takes_a_checked_plan_only(full, tmp_path):
  """The caller checks the plan once (check_plan, before any file); train refuses a raw one."""
  before = folder_digest(copy_checkpoints(full[0], tmp_path))
  model = build_model("gpt2_small", **TINY_GPT2)
  graph = structure_graph(model, "gpt2_small")
  raw = data_parallel_layout_plan(graph, global_batch=8, num_devices=8)
  with pytest.raises(TypeError, match="takes a Plan checked by planner.contract.check_plan"):
    train(model, graph, raw, steps=4, optimizer=optax.adam(1e-2),
          data=datalib.synthetic(model), checkpoint_dir=tmp_path / "ckpt")
  raw["layers"][1]["name"] = "h.9"
  with pytest.raises(UserError, match="plan layers do not match model gpt2_small"):
    check_plan(raw, graph, available_devices=8)
  assert folder_digest(tmp_path / "ckpt") == before


def test_checkpoints_of_another_model_size_are_refused_untouched(full, tmp_path):
  before = folder_digest(copy_checkpoints(full[0], tmp_path))
  model = build_model("gpt2_small", **{**TINY_GPT2, "d_model": 16})
  graph = structure_graph(model, "gpt2_small")
  plan = check_plan(data_parallel_layout_plan(graph, global_batch=8, num_devices=8), graph,
                    available_devices=8)
  with pytest.raises(UserError, match="holds checkpoints of a different gpt2_small"):
    train(model, graph, plan, steps=2, optimizer=optax.adam(1e-2),
          data=datalib.synthetic(model), checkpoint_dir=tmp_path / "ckpt")
  assert folder_digest(tmp_path / "ckpt") == before


def test_a_plan_is_trained_in_the_stages_it_records(tmp_path):
  """All layers on devices 0-1 (the walk makes one stage), recorded as two stages: train runs
  two programs with exactly those layers, and the same losses as the one-stage plan."""
  model = build_model("digits_mlp")
  graph = structure_graph(model, "digits_mlp")
  names = list(graph.names)
  d = data_parallel_layout_plan(graph, global_batch=4, num_devices=2)
  one = check_plan(d, graph, available_devices=2)
  two = check_plan({**d, "stages": [{"devices": [0, 2], "layers": names[:2]},
                                    {"devices": [0, 2], "layers": names[2:]}]},
                   graph, available_devices=2)
  results = [train(build_model("digits_mlp"), graph, p, steps=2,
                   optimizer=optax.sgd(0.05), data=datalib.synthetic(model, seed=3),
                   devices=jax.devices()[:2]) for p in (one, two)]
  assert [s.stage.layers for s in results[0].program.stages] == [tuple(names)]
  assert [s.stage.layers for s in results[1].program.stages] == [tuple(names[:2]),
                                                                 tuple(names[2:])]
  np.testing.assert_allclose(results[1].losses, results[0].losses, rtol=1e-5)
