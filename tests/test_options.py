"""Numeric options are checked where they enter, with the option's own name in the message."""

import math

import pytest
from omegaconf import OmegaConf

from dp_jax.base.errors import UserError
from dp_jax.config.rules import check_options


def cfg(**values):
  return OmegaConf.create(values)


@pytest.mark.parametrize("values, fragment", [
    ({"batch_size": 0}, "batch_size=0 must be >= 1"),
    ({"steps": -1}, "steps=-1 must be >= 0"),
    ({"train": {"steps": -1}}, "train.steps=-1 must be >= 0"),
    ({"optimizer": {"lr": math.nan}}, "optimizer.lr=nan must be a finite number"),
    ({"optimizer": {"lr": math.inf}}, "optimizer.lr=inf must be a finite number"),
    ({"optimizer": {"lr": 0.0}}, "optimizer.lr=0.0 must be > 0"),
    ({"planner": {"amplification_limit": 0.5}}, "planner.amplification_limit=0.5 must be >= 1"),
    ({"planner": {"amplification_limit": math.nan}}, "must be a finite number"),
    ({"cluster": {"num_devices": 0}}, "cluster.num_devices=0"),
    ({"cluster": {"inter_node_bandwidth_GBps": 0.0}}, "cluster.inter_node_bandwidth_GBps=0.0"),
    ({"cluster": {"intra_node_latency_us": -1.0}}, "cluster.intra_node_latency_us=-1.0"),
    ({"model": {"image_size": 0}}, "model.image_size=0"),
    ({"background": {"model": {"seq_len": -3}}}, "background.model.seq_len=-3"),
    ({"background": {"slowdown_cap": -0.1}}, "background.slowdown_cap=-0.1"),
    ({"profile": {"batches": [1, 0]}}, "profile.batches"),
])
def test_out_of_range_options_name_themselves(values, fragment):
  with pytest.raises(UserError) as e:
    check_options(cfg(**values))
  assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("values", [
    {"batch_size": None, "steps": 0, "train": {"steps": 0}},
    {"planner": {"amplification_limit": math.inf}, "background": {"slowdown_cap": math.inf}},
    {"optimizer": {"lr": 1e-3, "momentum": 0.0}, "cluster": {"num_devices": None}},
])
def test_valid_options_pass(values):
  check_options(cfg(**values))
