"""Every option's range is stated once, beside its field in its group's frozen dataclass
(dp_jax/base/checks.py), and checked when the typed config is made, with the option's own
dotted name in a one-line message: by library code, and at an app's edge where the name is
where the config holds it (background.model.seq_len)."""

import math

import pytest

from dp_jax.base.checks import ConfigError, Rule, build, option
from dp_jax.base.errors import UserError
from dp_jax.hardware.cluster import ClusterConfig, cluster_file
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.measurement.local import LocalConfig
from dp_jax.models.zoo import ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.planner import PlanOptions
from dp_jax.planner.options import PlannerConfig
from dp_jax.runtime.options import DataConfig, OptimizerConfig

CLUSTER = {**cluster_file("dgx_a100"), "num_nodes": 2}


@pytest.mark.parametrize("make, fragment", [
    (lambda: PlanOptions(num_devices=2, global_batch=0,
                         amplification_limit=math.inf), "batch_size=0 must be an integer >= 1"),
    (lambda: PlanOptions(num_devices=2, global_batch=8, amplification_limit=0.5),
     "planner.amplification_limit=0.5 must be >= 1"),
    (lambda: PlannerConfig(amplification_limit=math.nan), "must be a finite number (or inf)"),
    (lambda: PlannerConfig(sharding=("weights",)), "planner.sharding=['weights'] must include"),
    (lambda: PlannerConfig(sharding=("rows",)), "planner.sharding[0]='rows' is unknown"),
    (lambda: PlannerConfig(optimizer="lamb"), "planner.optimizer='lamb' is unknown (valid: sgd"),
    (lambda: build(ClusterConfig, {**CLUSTER, "num_devices": 0}), "cluster.num_devices=0"),
    (lambda: build(ClusterConfig, {**CLUSTER, "num_devices": 32}), "at most 16 devices"),
    (lambda: build(ClusterConfig, {**CLUSTER, "inter_node_bandwidth_GBps": 0.0}),
     "cluster.inter_node_bandwidth_GBps=0.0 must be > 0"),
    (lambda: build(ClusterConfig, {**CLUSTER, "intra_node_latency_us": -1.0}),
     "cluster.intra_node_latency_us=-1.0 must be >= 0"),
    (lambda: build(ClusterConfig, {k: v for k, v in CLUSTER.items() if k != "program_launch_us"}),
     "cluster.program_launch_us is required for cluster dgx_a100"),
    (lambda: build(ModelConfig, {"name": "vgg16", "image_size": 0}),
     "model.image_size=0 must be >= 1"),
    (lambda: build(BackgroundConfig, {"name": "x", "model": {"name": "gpt2_small",
                                                             "seq_len": -3}}),
     "background.model.seq_len=-3 must be >= 1"),
    (lambda: build(BackgroundConfig, {"name": "x", "model": {"name": "no_such_model"}}),
     "background.model.name='no_such_model' is not a zoo model"),
    (lambda: BackgroundConfig(name="x", slowdown_cap=-0.1), "background.slowdown_cap=-0.1"),
    (lambda: BackgroundConfig(on_failure="maybe"), "background.on_failure='maybe' is unknown"),
    (lambda: ProfileConfig(batches=(1, 0)), "profile.batches[1]=0 must be >= 1"),
    (lambda: ProfileConfig(batches=()), "profile.batches=[] is empty"),
    (lambda: ProfileConfig(source="file"), "profile.path is needed by profile.source=file"),
    (lambda: LocalConfig(steps=0), "local.steps=0 must be >= 1"),
    (lambda: OptimizerConfig(lr=math.nan), "optimizer.lr=nan must be a finite number"),
    (lambda: OptimizerConfig(lr=0.0), "optimizer.lr=0.0 must be > 0"),
    (lambda: OptimizerConfig(name="lamb"), "optimizer.name='lamb' is unknown"),
    (lambda: DataConfig(source="csv"), "data.source='csv' is unknown"),
    (lambda: build(PlannerConfig, {"amplification_limt": 2}),
     "planner.amplification_limt is not an option (did you mean planner.amplification_limit?)"),
])
def test_the_dataclass_that_holds_a_value_checks_it_and_names_it(make, fragment):
  with pytest.raises(UserError) as e:
    make()
  assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_valid_values_pass_and_are_normalised():
  assert PlannerConfig(amplification_limit=math.inf).amplification_limit == math.inf
  assert BackgroundConfig(slowdown_cap=math.inf).slowdown_cap == math.inf
  assert OptimizerConfig(momentum=0.0).momentum == 0.0
  # a list from a composed config becomes the declared tuple, in the declared order
  assert PlannerConfig(sharding=["weights", "samples"]).sharding == ("samples", "weights")
  assert build(ClusterConfig, CLUSTER).num_devices is None  # every device of the pod


def test_each_default_is_stated_once():
  """A planning run's options inherit the planner group's defaults: nothing restates them."""
  run = PlanOptions(num_devices=4, global_batch=8)
  assert run.amplification_limit == PlannerConfig().amplification_limit == 2.0
  assert PlanOptions.of(PlannerConfig(mode="frontier"), 4, 8).mode == "frontier"


def test_a_rule_names_a_range_a_list_or_its_choices():
  with pytest.raises(ConfigError, match=r"x=3 must be >= 4 and < 9 \(a hint\)"):
    Rule(low=4, high=9, high_open=True, hint="a hint").check("x", 3)
  with pytest.raises(ConfigError, match="x='c' is unknown"):
    Rule(choices=("a", "b")).check("x", "c")
  assert Rule(integer=True, each=True, low=0).check("x", [1, 2]) == (1, 2)
  assert option(3, low=1).metadata["rule"] == Rule(low=1)
