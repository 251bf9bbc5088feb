"""experiments/studies.py: the registry of studies and the app each one sweeps."""

import pytest

from dp_jax.base.errors import UserError
from experiments import studies


@pytest.mark.parametrize("name, app", [("strong_scaling", "plan"), ("amplification", "plan"),
                                       ("cluster_throughput", "simulate"),
                                       ("network", "simulate"), ("runtime", "train"),
                                       ("time_to_accuracy", "accuracy"),
                                       ("weight_sharding", "plan"),
                                       ("where_burst_pays", "simulate")])
def test_each_study_names_its_app_and_columns(name, app):
  s = studies.study(name)
  assert s.name == name and s.app == app
  assert s.csv_columns[:3] == ["job", "cell", "status"] and "git_sha" in s.csv_columns
  assert not set(s.timing) & set(s.csv_columns)
  assert f"+experiment={name}" in s.doc


def test_unknown_study_is_one_line(capsys):
  with pytest.raises(UserError, match="valid studies"):
    studies.study("nope")
  assert studies.main(["nope"]) == 2
  assert capsys.readouterr().err.startswith("error: unknown study 'nope'")
