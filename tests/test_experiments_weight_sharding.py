"""experiments/weight_sharding.py: the gain of weight sharding, computed from the cells."""

from experiments.weight_sharding import SAMPLES, STUDY, WEIGHTS


def cell(g, sharding, ms, cluster="dgx_a100"):
  return {"status": "ok", "model": "vgg16", "cluster": cluster, "device": "A100-SXM4-40GB",
          "num_devices": g, "global_batch": 32, "sharding": sharding, "iteration_ms": ms,
          "weight_sharded_layers": 3 if sharding == WEIGHTS else 0}


def test_the_readme_states_the_best_gain_over_samples_only_and_where():
  rows = STUDY.finish([cell(8, SAMPLES, 10.0), cell(8, WEIGHTS, 7.0), cell(32, SAMPLES, 6.08),
                       cell(32, WEIGHTS, 2.8), cell(4, SAMPLES, 15.0, "a100_nvlink_8"),
                       cell(4, WEIGHTS, 14.9, "a100_nvlink_8")])
  md = STUDY.headline(rows)
  assert md.startswith("Splitting weights as well as samples is up to 2.17x ahead against "
                       "samples only (vgg16 on dgx_a100, G=32, B=32; predicted); over the 3 cells "
                       "with both plans: 2 ahead, 1 tie, 0 behind.\n")


def test_without_both_plans_no_gain_is_claimed():
  md = STUDY.headline(STUDY.finish([cell(8, WEIGHTS, 7.0)]))
  assert md.startswith("No cell has both plans")
