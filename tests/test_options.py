"""Every option's range is stated once (config/rules.py) and checked by the typed option that
holds the value, with the option's own name in a one-line message."""

import math

import pytest

from dp_jax.base.errors import UserError
from dp_jax.base.rules import RULES, check
from dp_jax.hardware.cluster import cluster_file, job_from_config
from dp_jax.layer_times.sources import ProfileOptions
from dp_jax.models.zoo import ModelSpec
from dp_jax.multiplex.background import BackgroundSpec
from dp_jax.planner import PlanOptions


@pytest.mark.parametrize("key, value, fragment", [
    ("batch_size", 0, "batch_size=0 must be >= 1"),
    ("steps", -1, "steps=-1 must be >= 0"),
    ("train.steps", -1, "train.steps=-1 must be >= 0"),
    ("optimizer.lr", math.nan, "optimizer.lr=nan must be a finite number"),
    ("optimizer.lr", math.inf, "optimizer.lr=inf must be a finite number"),
    ("optimizer.lr", 0.0, "optimizer.lr=0.0 must be > 0"),
    ("planner.amplification_limit", 0.5, "planner.amplification_limit=0.5 must be >= 1"),
    ("planner.amplification_limit", math.nan, "must be a finite number"),
    ("profile.batches", [1, 0], "profile.batches[1]=0 must be >= 1"),
    ("profile.batches", [], "profile.batches=[] is empty"),
    ("local.steps", 0, "local.steps=0 must be >= 1"),
])
def test_a_value_out_of_its_range_names_itself(key, value, fragment):
  with pytest.raises(UserError) as e:
    check(key, value)
  assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("key, value", [
    ("planner.amplification_limit", math.inf), ("background.slowdown_cap", math.inf),
    ("optimizer.momentum", 0.0), ("cluster.num_devices", None)])
def test_valid_values_pass(key, value):
  assert check(key, value) == value


def test_every_rule_names_a_distinct_option():
  keys = [r.key for r in RULES]
  assert len(keys) == len(set(keys))


CLUSTER = {**cluster_file("dgx_a100"), "num_nodes": 2}


@pytest.mark.parametrize("decode, fragment", [
    (lambda: PlanOptions(num_devices=2, global_batch=0), "batch_size=0 must be >= 1"),
    (lambda: PlanOptions(num_devices=2, global_batch=8, amplification_limit=0.5),
     "planner.amplification_limit=0.5 must be >= 1"),
    (lambda: job_from_config({**CLUSTER, "num_devices": 0}), "cluster.num_devices=0"),
    (lambda: job_from_config({**CLUSTER, "num_devices": 32}), "at most 16 devices"),
    (lambda: job_from_config({**CLUSTER, "inter_node_bandwidth_GBps": 0.0}),
     "inter_node_bandwidth_GBps must be > 0"),
    (lambda: job_from_config({**CLUSTER, "intra_node_latency_us": -1.0}),
     "intra_node_latency_us must be >= 0"),
    (lambda: ModelSpec.from_config({"name": "vgg16", "image_size": 0}),
     "model.image_size=0 must be a positive integer"),
    (lambda: BackgroundSpec.from_config({"name": "x", "model": {"name": "gpt2_small",
                                                                 "seq_len": -3}}),
     "model.seq_len=-3 must be a positive integer"),
    (lambda: BackgroundSpec(name="x", slowdown_cap=-0.1), "background.slowdown_cap=-0.1"),
    (lambda: ProfileOptions(batches=(1, 0)), "profile.batches[1]=0"),
])
def test_the_typed_option_that_holds_a_value_checks_its_range(decode, fragment):
  with pytest.raises(UserError) as e:
    decode()
  assert fragment in str(e.value) and "\n" not in str(e.value)
