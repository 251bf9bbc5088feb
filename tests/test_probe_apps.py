"""Probe rows of issue 27 through the apps as a user runs them: one line, non-zero exit, and an
existing run folder left byte-identical."""

import os
import subprocess
import sys
import time

import pytest
from apps import REPO, assert_one_line_error, digest, run_app
from test_plan_app import write_graph_and_profile

from dp_jax.runtime.local_devices import other_xla_flags

QUIET = ["logger=disabled"]


@pytest.fixture(scope="module")
def plan_folder(tmp_path_factory):
  """A finished plan run (graph + profile files: fast) and its arguments."""
  cwd = tmp_path_factory.mktemp("plan")
  gpath, ppath = write_graph_and_profile(cwd)
  args = [f"graph={gpath}", f"profile={ppath}", "cluster=a100_nvlink_8", "batch_size=8",
          "cluster.num_devices=4", *QUIET]
  result = run_app("plan", *args, cwd=cwd)
  assert result.returncode == 0, result.stderr
  return cwd, args


@pytest.mark.parametrize("override, fragment", [
    ("+nosuchkey=1", "unknown option nosuchkey"),
    ("+planner.amplificaton_limit=1", "did you mean planner.amplification_limit?"),
    ("+model.foo=1", "unknown option model.foo"),
    ("cluster.inter_node_bandwidth_GBps=400", "400 Gb/s is 50 GB/s"),
    ("out=[plan.json", "quote a value"),  # non-ASCII is quoted for the parser: test_probe_overrides
])
def test_plan_refuses_with_one_line_and_keeps_its_run_folder(plan_folder, override, fragment):
  cwd, args = plan_folder
  before = digest(cwd / "run")
  assert_one_line_error(run_app("plan", *args, override, cwd=cwd), fragment)
  assert digest(cwd / "run") == before


def test_an_added_model_target_is_not_silently_ignored(plan_folder):
  cwd, args = plan_folder
  before = digest(cwd / "run")
  result = run_app("plan", *[a for a in args if not a.startswith("graph=")],
                   "+model._target_=mypkg.ViT", cwd=cwd)
  line = assert_one_line_error(result)
  assert "_target_" in line or "mypkg" in line, line
  assert digest(cwd / "run") == before


def h100_args(tmp_path):
  """A graph and an A100 profile file (as profile=deeppool_a100 gives, without tracing VGG16)
  planned on DGX H100."""
  gpath, ppath = write_graph_and_profile(tmp_path)
  return [f"graph={gpath}", f"profile={ppath}", "cluster=dgx_h100", "cluster.num_devices=4",
          "batch_size=8", *QUIET]


def test_plan_with_a_profile_of_another_device_names_both(plan_folder):
  cwd, args = plan_folder
  before = digest(cwd / "run")
  assert_one_line_error(run_app("plan", *h100_args(cwd), cwd=cwd),
                        "A100-SXM4-40GB", "H100-SXM5-80GB", "profile.allow_other_device")
  assert digest(cwd / "run") == before


def test_a_profile_of_another_device_accepted_on_purpose_is_recorded(tmp_path):
  import json

  result = run_app("plan", *h100_args(tmp_path), "profile.allow_other_device=true", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  plan = json.loads((tmp_path / "run" / "plan.json").read_text())
  assert plan["profile"]["device"] == "A100-SXM4-40GB"
  assert plan["profile"]["other_device"] == {"profile_device": "A100-SXM4-40GB",
                                             "cluster_device": "H100-SXM5-80GB",
                                             "accepted": True}


def test_simulate_names_a_key_set_under_a_null_background_model(tmp_path):
  assert_one_line_error(run_app("simulate", "background.model.name=nosuch", *QUIET, cwd=tmp_path),
                        "background.model.name=nosuch", "background.model is null")


@pytest.mark.parametrize("app, override, fragment", [
    ("accuracy", "accuracy.lrs=[nan]", "accuracy.lrs[0]=nan"),
    ("accuracy", "accuracy.max_epochs=nan", "accuracy.max_epochs=nan"),
    ("validate", "validate.max_segments=0", "validate.max_segments=0"),
    ("validate", "validate.amplification_limits=[]", "validate.amplification_limits=[]"),
    ("train", "+stesp=500", "did you mean steps?"),
])
def test_bad_options_stop_an_app_before_it_works(tmp_path, app, override, fragment):
  import json

  result = run_app(app, override, *QUIET, cwd=tmp_path)
  assert_one_line_error(result, fragment)
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert status["status"] == "failed" and fragment in status["error"]
  made = {p.name for p in (tmp_path / "run").iterdir()}
  assert made <= {"status.json", "config.json", "provenance.json", ".hydra", f"{app}.log"}, made


def test_two_runs_started_together_get_two_default_folders(tmp_path):
  env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
  env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  gpath, ppath = write_graph_and_profile(tmp_path)
  cmd = [sys.executable, "-m", "dp_jax.plan", f"graph={gpath}", f"profile={ppath}",
         "cluster=a100_nvlink_8", "batch_size=8", "cluster.num_devices=4", *QUIET]
  procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE) for _ in range(2)]
  for p in procs:
    assert p.wait(timeout=300) == 0, p.stderr.read().decode()
  folders = [p.parent for p in (tmp_path / "outputs").rglob("plan.json")]
  assert len(set(folders)) == 2, folders


def test_an_out_that_is_not_a_file_is_refused_before_any_work(tmp_path):
  """Issue 41: out=/dev/full reported success (the device replaced by a file, as root);
  a FIFO stands in for it here."""
  gpath, ppath = write_graph_and_profile(tmp_path)
  fifo = tmp_path / "plan.fifo"
  os.mkfifo(fifo)
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", "cluster=a100_nvlink_8",
                   "batch_size=8", "cluster.num_devices=4", f"out={fifo}", *QUIET, cwd=tmp_path)
  assert_one_line_error(result, f"out={fifo}", "is a FIFO (named pipe), not a regular file")
  assert not (tmp_path / "run" / "plan.json").exists()


def test_a_measured_profile_of_another_device_is_refused_before_measuring(tmp_path):
  """Issue 41: profile=measure for an H100 cluster at 224 px measured for minutes first."""
  start = time.perf_counter()
  result = run_app("plan", "model=vgg16", "cluster=dgx_h100", "profile=measure", *QUIET,
                   cwd=tmp_path)
  assert_one_line_error(result, "profile measure is of cpu devices", "H100-SXM5-80GB")
  assert time.perf_counter() - start < 60, "it measured first"
  assert not (tmp_path / ".cache" / "dp_jax" / "profiles").exists()


def test_no_slowdown_cap_simulates_and_draws(tmp_path):
  """Issue 41: background.slowdown_cap=inf ended in matplotlib's 'Axis limits cannot be NaN or
  Inf' (the cap's mark on the Gantt chart)."""
  gpath, ppath = write_graph_and_profile(tmp_path)
  result = run_app("simulate", f"graph={gpath}", f"profile={ppath}", "cluster=a100_nvlink_8",
                   "batch_size=8", "cluster.num_devices=4", "background=same_family",
                   "background.slowdown_cap=inf", *QUIET, cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert (tmp_path / "run" / "gantt.png").stat().st_size > 0


def test_a_plan_file_without_its_schema_is_not_trained(tmp_path):
  import json

  from test_probe_stop import idle_plan

  path = idle_plan(tmp_path).removeprefix("plan=")
  plan = json.loads(open(path).read())
  del plan["schema"]
  open(path, "w").write(json.dumps(plan))
  result = run_app("train", "model=gpt2", "model.n_layer=2", "model.d_model=32",
                   "model.n_head=2", "model.seq_len=16", "model.vocab_size=64",
                   "runtime.num_devices=2", f"plan={path}", "steps=2", *QUIET, cwd=tmp_path)
  assert_one_line_error(result, f"plan file {path}: missing required field 'schema'")
  assert not (tmp_path / "run" / "metrics.jsonl").exists()
