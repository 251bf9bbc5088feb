"""Models, clusters and sweeps of one's own (docs/extending.md): targets, the zoo's ViT, the
examples/ package through the command line, cluster files, sweep tables and W&B lineage."""

import csv
import hashlib
import json

import pytest
from apps import REPO, assert_one_line_error, run_app
from omegaconf import OmegaConf
from wandb_files import records, run_file

from dp_jax.base.checks import build
from dp_jax.base.errors import UserError
from dp_jax.layer_times.deeppool_import import import_deeppool_a100
from dp_jax.models import zoo

EXAMPLES = REPO / "examples"
VIT, MIXER, LM = (EXAMPLES / "conf" / "model" / f"{n}.yaml"
                   for n in ("tiny_vit", "tiny_mixer", "tiny_lm"))
NAMES = ["tiny_vit", "tiny_mixer", "tiny_lm"]
USER_ENV = {"PYTHONPATH": f"{REPO}:{EXAMPLES}"}  # the user's package on the path, as they would


def vit_reference_params(dim=512, patch=16, image=256, blocks=6, heads=4, dim_head=128,
                         mlp=1024, classes=1000) -> int:
  """DeepPool's examples/vit.py, counted layer by layer from its definition."""
  tokens = (image // patch) ** 2 + 1
  prep = (3 * patch * patch) * dim + dim + dim + tokens * dim  # projection + bias, cls, positions
  block_a = dim * 3 * heads * dim_head + heads * dim_head * dim + 2 * dim  # qkv, W_0, LayerNorm
  block_b = dim * mlp + mlp + mlp * dim + dim + 2 * dim  # two linears with bias, LayerNorm
  return prep + blocks * (block_a + block_b) + dim * classes + classes


def test_zoo_vit_matches_deeppool_parameter_count_and_table():
  graph = build(zoo.ModelConfig, OmegaConf.load(REPO / "conf" / "model" / "vit.yaml")).graph()
  assert sum(n.params for n in graph.nodes) == vit_reference_params() == 13_643_240
  assert [n.kind for n in graph.nodes[:3]] == ["patch_embed", "self_attention", "mlp_block"]
  table, report = import_deeppool_a100(graph)
  assert report.unmatched == [] and report.filled == [] and report.estimated == {}
  assert set(report.sources.values()) == {"vitLayerGpuProfileA100.txt"}
  assert table.batches("blocks.0.attn") == [1, 2, 4, 8, 16, 32, 64, 128]
  # TransBlockA at batch 32: p50 2.810 ms forward+backward, split 1/3 : 2/3
  fwd, bwd = table.layers["blocks.0.attn"][32]
  assert fwd == pytest.approx(2.810 / 3) and bwd == pytest.approx(2 * 2.810 / 3)


def test_vit_rows_the_table_lacks_are_estimated_and_named():
  cfg = OmegaConf.load(REPO / "conf" / "model" / "vit.yaml")
  cfg.kwargs.mlp_dim = 2048  # DeepPool timed dim_linear_block 1024 only
  table, report = import_deeppool_a100(build(zoo.ModelConfig, cfg).graph())
  assert sorted(report.filled) == [f"blocks.{i}.mlp" for i in range(6)]
  assert set(table.meta["estimated_layers"]) == set(report.filled)
  assert all(f > 0 and w > 0 for f, w in table.layers["blocks.0.mlp"].values())


def test_plan_vit_on_deeppool_a100(tmp_path):
  result = run_app("plan", "model=vit", "cluster=a100_nvlink_8", "batch_size=32",
                   "profile=deeppool_a100", "logger=disabled", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  plan = json.loads((tmp_path / "run" / "plan.json").read_text())
  assert plan["model"] == "vit" and plan["global_batch"] == 32 and plan["num_devices"] == 8
  assert plan["profile"]["source"] == "imported" and plan["profile"]["estimated_layers"] == []
  assert len(plan["layers"]) == 15 and plan["predicted"]["iteration_ms"] > 0


def test_sequential_model_gets_layer_specs_and_forward():
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from dp_jax.models.base import ImageModel, run_layers

  class Tiny(ImageModel):
    def __init__(self, *, rngs):
      self.image_size, self.num_classes = 4, 3
      self.layers = nnx.List([nnx.Linear(3, 5, rngs=rngs), nnx.LayerNorm(5, rngs=rngs),
                              nnx.Linear(5, 3, rngs=rngs)])

  model = Tiny(rngs=nnx.Rngs(0))
  specs = model.layer_specs()
  assert [(s.name, s.kind, s.inputs) for s in specs] == [
      ("layers.0", "linear", ()), ("layers.1", "layernorm", ("layers.0",)),
      ("layers.2", "linear", ("layers.1",))]
  assert specs[0].attrs == {"in_features": 3, "out_features": 5, "bias": True}
  x = jnp.ones((2, 4, 4, 3))
  assert jnp.allclose(model(x), run_layers(model, x))
  assert jax.eval_shape(model, x).shape == (2, 4, 4, 3)


@pytest.mark.parametrize("target,kwargs,match", [
    ("no_such_pkg.Model", {}, "cannot import _target_ 'no_such_pkg.Model'.*PYTHONPATH"),
    ("dp_jax.models.vit.ViT", {"depth": 2}, r"option\(s\) depth do not apply to model m "
                                             r"\(dp_jax.models.vit.ViT takes: .*patch_size"),
    ("dp_jax.models.zoo.SIZE_KEYS", {}, "is not a class or function"),
    ("dp_jax.models.vit.ClassToken", {}, "must take a keyword argument 'rngs'"),
])
def test_bad_targets_are_one_line_errors(target, kwargs, match):
  with pytest.raises(UserError, match=match):
    build(zoo.ModelConfig, {"_target_": target, "name": "m", "kwargs": kwargs}).build(
        abstract=True)


def test_a_zoo_name_on_another_target_is_refused():
  with pytest.raises(UserError, match="model.name='resnet50' is the zoo's .*resnet50, not "
                                      "dp_jax.models.vgg.VGG16"):
    build(zoo.ModelConfig, {"_target_": "dp_jax.models.vgg.VGG16", "name": "resnet50"})


def inspect_plan_simulate_and_train(tmp_path, files, names):
  """The examples' models `files` (named `names`) through the four apps, one sweep per app."""
  models = "model=" + ",".join(str(f) for f in files)
  step = {n: tmp_path / n for n in ("inspect", "plan", "simulate", "train")}
  for folder in step.values():
    folder.mkdir()
  cells = [str(i) for i in range(len(names))]
  result = run_app("inspect", "-m", models, "logger=disabled", cwd=step["inspect"], env=USER_ENV)
  assert result.returncode == 0, result.stderr
  graphs = {g["model"]: g for g in (json.loads((step["inspect"] / "sweep" / i / "graph.json")
                                               .read_text()) for i in cells)}
  assert list(graphs) == names
  if "tiny_mixer" in graphs:
    assert [n["name"] for n in graphs["tiny_mixer"]["nodes"]] == [f"layers.{i}" for i in range(6)]
  if "tiny_lm" in graphs:  # the LM's own specs: a fork/join per block
    lm = {n["name"]: n for n in graphs["tiny_lm"]["nodes"]}
    assert lm["blocks.0.join"]["inputs"] == ["embed", "blocks.0.attn", "blocks.0.mlp"]
    assert lm["blocks.1.attn"]["inputs"] == ["blocks.0.join"] and list(lm)[-1] == "head"
    assert lm["embed"]["attrs"]["vocab_size"] == 64 and lm["head"]["out_shape"] == [16, 64]

  result = run_app("plan", "-m", models, "cluster=local_cpu", "cluster.num_devices=2",
                   "batch_size=8", "profile=analytic", "planner.amplification_limit=inf",
                   cwd=step["plan"], env=USER_ENV)
  assert result.returncode == 0, result.stderr
  plans = step["plan"] / "sweep"
  for i, name in enumerate(names):
    plan = json.loads((plans / str(i) / "plan.json").read_text())
    options = plan["made_for"]["options"]
    assert plan["model"] == name and options.get("patch", 8) == 8
    if name == "tiny_lm":
      assert options["seq_len"] == 16 and options["vocab_size"] == 64

  result = run_app("simulate", "-m", models, "cluster=local_cpu", "cluster.num_devices=2",
                   "batch_size=8", "profile=analytic", "background=none", "logger=disabled",
                   cwd=step["simulate"], env=USER_ENV)
  assert result.returncode == 0, result.stderr
  for i in cells:
    metrics = json.loads((step["simulate"] / "sweep" / i / "metrics.json").read_text())
    assert metrics["num_devices"] == 2 and metrics["alone_iteration_ms"] > 0

  # 3-step runs under the burst plans the planning runs wrote (cell i: plans/<i>/plan.json)
  result = run_app("train", "-m", models, f"plan={plans}/${{hydra:job.num}}/plan.json",
                   "runtime.num_devices=2", "steps=3", "runtime.progress=false",
                   cwd=step["train"], env=USER_ENV)
  assert result.returncode == 0, result.stderr
  for i, name in enumerate(names):
    train, plan_file = step["train"] / "sweep" / str(i), plans / str(i) / "plan.json"
    status = json.loads((train / "status.json").read_text())
    assert status["final_step"] == 3 and status["model"] == name
    assert status["plan"] == str(plan_file)
    metrics = (train / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(ln)["loss"] for ln in metrics]
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
    # lineage: the training run used the very plan artifact the planning run logged
    logged, used = artifacts(plans / str(i)), artifacts(train)
    plan_name = f"plan-{name}-{hashlib.sha256(plan_file.read_bytes()).hexdigest()[:12]}"
    assert logged[plan_name][1] is False and used[plan_name] == (logged[plan_name][0], True)
    assert any(n.startswith("checkpoint-") and not use for n, (_, use) in used.items())
  table = (step["train"] / "sweep" / "sweep_summary.csv").read_text()
  assert "iteration ms (measured)" in table and all(name in table for name in names)


def test_the_example_language_model_through_inspect_plan_simulate_and_train(tmp_path):
  # the language model (examples/my_models/lm.py: its own layer_specs with fork/join blocks,
  # token input_spec and label_spec), a sweep of one cell per app; the image models too below
  inspect_plan_simulate_and_train(tmp_path, [LM], ["tiny_lm"])


@pytest.mark.slow  # about 30 s; the default run takes the language model alone through them
def test_examples_inspect_plan_simulate_and_train_through_the_cli(tmp_path):
  # the image models and the language model, one sweep of three cells per app
  inspect_plan_simulate_and_train(tmp_path, [VIT, MIXER, LM], NAMES)


def test_the_documented_npz_format_feeds_the_example_language_model(tmp_path, monkeypatch):
  # docs/extending.md, "Data": x (N, seq_len) int32 token ids, y (N, seq_len) the next tokens
  import numpy as np
  from flax import nnx

  from dp_jax.runtime.data import make_source

  monkeypatch.syspath_prepend(str(EXAMPLES))
  from my_models.lm import ParallelLM

  model = nnx.eval_shape(lambda: ParallelLM(rngs=nnx.Rngs(0)))  # tiny_lm.yaml: its defaults
  tokens = np.random.default_rng(0).integers(0, 64, (10, 17)).astype(np.int32)
  np.savez(tmp_path / "t.npz", x=tokens[:, :-1], y=tokens[:, 1:])
  src = make_source("npz", model, path=str(tmp_path / "t.npz"))
  assert (src.x_shape, src.y_shape, src.num_labels, src.num_samples) == ((16,), (16,), 64, 10)
  assert src.tokens and (src.read_y(np.array([3])) == tokens[3:4, 1:]).all()
  np.savez(tmp_path / "bad.npz", x=tokens[:, :-1], y=tokens[:, 1:] + 1)  # a label of 64
  with pytest.raises(UserError, match=r"y values must lie in \[0, 64\).*vocab_size"):
    make_source("npz", model, path=str(tmp_path / "bad.npz"))


def artifacts(folder):
  """{artifact name: (digest, used rather than logged)} of a job's offline W&B run."""
  return {r.artifact.name: (r.artifact.digest, r.artifact.use_after_commit)
          for r in records(run_file(folder)) if r.WhichOneof("record_type") == "artifact"
          and r.artifact.type != "run_table"}


@pytest.mark.slow  # a sweep of the simulate app; test_experiments sweeps a simulated study
def test_simulate_sweep_on_own_cluster_file_writes_one_table_and_groups_its_runs(tmp_path):
  shipped = OmegaConf.load(REPO / "conf" / "cluster" / "a100_nvlink_8.yaml")
  mine = tmp_path / "my_a100.yaml"  # a cluster of one's own: a file outside conf/
  OmegaConf.save(OmegaConf.merge(shipped, {"name": "my_a100", "num_nodes": 2}), mine)
  result = run_app("simulate", "-m", "model=digits_mlp", "profile=analytic", f"cluster={mine}",
                   "cluster.num_devices=2,4,16", "planner.amplification_limit=1.5,2",
                   "batch_size=32", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  sweep = tmp_path / "sweep"
  with (sweep / "sweep_summary.csv").open() as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
  assert [r["G"] for r in rows] == ["2", "2", "4", "4", "16", "16"]
  assert [r["A"] for r in rows] == ["1.5", "2.0"] * 3 and {r["cluster"] for r in rows} == {
      "my_a100"}
  for i, r in enumerate(rows):
    metrics = json.loads((sweep / str(i) / "metrics.json").read_text())
    assert float(r["iteration ms alone (simulated)"]) == pytest.approx(
        metrics["alone_iteration_ms"], rel=1e-3)
    assert float(r["cluster throughput / DP on all G alone (simulated)"]) > 0
    assert r["verdict vs fastest DP"] in ("ahead", "tie", "behind")
    config = json.loads((sweep / str(i) / "config.json").read_text())
    assert config["cluster"]["num_nodes"] == 2
  md = (sweep / "sweep_summary.md").read_text().splitlines()
  assert len(md) == 8 and "iteration ms (predicted)" in md[0]
  groups, names = set(), set()
  for i in range(6):
    recs = records(run_file(sweep / str(i)))
    run = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    groups.add(run.run_group)
    names.add(run.display_name)
    plan = (sweep / str(i) / "plan.json").read_bytes()
    assert f"plan-digits_mlp-{hashlib.sha256(plan).hexdigest()[:12]}" in artifacts(sweep / str(i))
  assert groups == {"sweep"} and len(names) == 6
  assert "simulate digits_mlp my_a100 G4 B32 A1.5 fp32" in names


@pytest.mark.parametrize("cluster,fragments", [
    ("missing.yaml", ("cluster file not found", "hydra.searchpath=[file://<dir>]")),
    ("h100_4x8", ("unknown cluster 'h100_4x8'", "cluster=path/to/h100_4x8.yaml")),
])
def test_cluster_file_errors_say_how(tmp_path, cluster, fragments):
  result = run_app("plan", f"cluster={cluster}", "logger=disabled", cwd=tmp_path)
  assert_one_line_error(result, *fragments)


@pytest.mark.slow
def test_examples_through_profile_measure_validate_and_pipeline(tmp_path):
  step = {n: tmp_path / n for n in ("profile", "validate", "pipeline")}
  for folder in step.values():
    folder.mkdir()
  result = run_app("profile", f"model={MIXER}", "profile=measure", "profile.batches=[1,2]",
                   "profile.repeats=1", "profile.warmup=0", f"profile.cache_dir={tmp_path}/c",
                   "logger=disabled", cwd=step["profile"], env=USER_ENV)
  assert result.returncode == 0, result.stderr
  profile = json.loads((step["profile"] / "run" / "profile.json").read_text())
  assert profile["source"] == "measured" and len(profile["layers"]) == 6
  assert all(set(rows) == {"1", "2"} for rows in profile["layers"].values())

  result = run_app("validate", f"model={MIXER}", "batch_size=8", "validate.plans=2",
                   "local.steps=2", "local.warmup=1", "local.num_devices=2",
                   "local.profile_repeats=1", "local.profile_passes=1",
                   "local.profile_cuts=1", "validate.amplification_limits=[1.5]",
                   f"local.cache_dir={tmp_path}/c", "logger=disabled", cwd=step["validate"],
                   env=USER_ENV, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  status = json.loads((step["validate"] / "run" / "status.json").read_text())
  assert status["model"] == "tiny_mixer" and status["plans"] >= 2

  result = run_app("pipeline", f"model={VIT}", "local.num_devices=2", "batch_size=4",
                   "local.steps=2", "local.warmup=1", "local.profile_repeats=1",
                   "local.profile_passes=1", "local.profile_cuts=0",
                   f"local.cache_dir={tmp_path}/c",
                   "background=none", "logger=disabled",
                   "paper.settings=[{cluster: a100_nvlink_8, num_devices: 8}]",
                   cwd=step["pipeline"], env=USER_ENV, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads((step["pipeline"] / "run" / "summary.json").read_text())
  assert summary["local"]["model"]["value"].startswith("tiny_vit")
  for plan in ("burst", "data_parallel"):  # predicted and measured here
    local = summary["local"]
    assert local[f"{plan}_predicted_ms"]["value"] > 0 and local[f"{plan}_measured_ms"]["value"] > 0
