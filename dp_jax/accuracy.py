"""python -m dp_jax.accuracy: steps to a target test accuracy on the digits at one global batch.

    python -m dp_jax.accuracy model=digits_mlp batch_size=32 accuracy.target=0.97

Trains every learning rate x seed of `accuracy` at global batch B
(dp_jax/convergence/steps_to_target.py),
keeps the learning rate with the fewest median steps, measures the simple gradient noise scale
at initialisation and where its runs reached the target (dp_jax/convergence/noise_scale.py), and
asks the planner for the predicted time per step of data parallelism and of the burst plan at B
on each G of accuracy.devices (G <= B) for the model on `cluster` with `profile`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from flax import nnx

from dp_jax.base.checks import REQUIRED, Checked, ConfigError, option
from dp_jax.base.errors import UserError
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.convergence import digits
from dp_jax.convergence import steps_to_target as convergence
from dp_jax.convergence.noise_scale import noise_scale_fn
from dp_jax.convergence.steps_to_target import Sweep
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.measurement import profiles
from dp_jax.models.zoo import MODEL_NAMES, ZOO, ModelConfig
from dp_jax.planner import PlanOptions, plan_for
from dp_jax.planner.options import PlannerConfig
from dp_jax.tracking.run import LoggerConfig, Run


@dataclass(frozen=True)
class AccuracySettings(Checked):
  """The accuracy group: the learning-rate grid, seeds, target and budget of one batch size.

  target: the test accuracy to reach; lrs: the grid at B = lr_reference_batch, 2^(k/2) for
  k = -13..-4 (0.011 .. 0.25, a factor sqrt(2) apart), scaled at B by
  (B / lr_reference_batch)^lr_batch_power, so the grid follows the optimum, which grows with B
  (B = 8: 0.0055 .. 0.125; B = 512: 0.044 .. 1.0; the study flags a best learning rate at the
  edge of its grid); max_epochs: the step budget (max_epochs x training
  examples / B); eval_every_samples: test accuracy every max(1, this // B) steps; devices: the
  G to plan; step_time_models: zoo models (default sizes) whose predicted step time is also
  reported, for a hypothetical "these steps(B), that model's step" combination.
  """

  GROUP = "accuracy"

  target: float = option(0.97, low=0, low_open=True, high=1)
  lrs: tuple[float, ...] = option(default_factory=lambda: (
      0.0110485, 0.015625, 0.0220971, 0.03125, 0.0441942, 0.0625, 0.0883883, 0.125, 0.1767767,
      0.25), low=0, low_open=True, each=True)
  lr_reference_batch: int = option(32, low=1, integer=True)
  lr_batch_power: float = option(0.5)
  seeds: tuple[int, ...] = option(default_factory=lambda: (0, 1, 2, 3, 4), low=0, integer=True,
                                  each=True)
  momentum: float = option(0.9, low=0, high=1, high_open=True)
  max_epochs: float = option(40.0, low=0, low_open=True)
  eval_every_samples: int = option(128, low=1, integer=True)
  devices: tuple[int, ...] = option(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64), low=1,
                                    integer=True, each=True)
  step_time_models: tuple[str, ...] = ()

  def check(self) -> None:
    unknown = [n for n in self.step_time_models if n not in ZOO]
    if unknown:
      raise ConfigError("step_time_models", f": unknown model '{unknown[0]}'; valid models: "
                        f"{', '.join(MODEL_NAMES)}")


@dataclass(frozen=True)
class AccuracyConfig(Checked):
  """python -m dp_jax.accuracy: steps to a target accuracy at one B, and predicted step times.

  data_seed: the train/test split; seed: unused by training (accuracy.seeds), kept for the
  shared provenance columns.
  """

  model: ModelConfig = REQUIRED
  cluster: ClusterConfig = REQUIRED
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  accuracy: AccuracySettings = field(default_factory=AccuracySettings)
  batch_size: int = option(32, low=1, integer=True)
  data_seed: int = 0
  seed: int = 0

  def check(self) -> None:
    if self.model.name not in ("digits_cnn", "digits_mlp"):
      raise ConfigError("model", f": the accuracy app trains on the 8x8 digits; model "
                        f"'{self.model.name}' is not a digits model (use model=digits_mlp or "
                        "model=digits_cnn)")


def sweep_of(a: AccuracySettings, b: int, num_train: int) -> Sweep:
  """The convergence.Sweep of the accuracy group `a` at global batch `b` for `num_train`
  training examples."""
  every = max(1, a.eval_every_samples // b)
  budget = math.ceil(a.max_epochs * num_train / b)
  scale = (b / a.lr_reference_batch) ** a.lr_batch_power
  return Sweep(batch=b, lrs=tuple(float(x) * scale for x in a.lrs),
               seeds=tuple(int(s) for s in a.seeds), target=float(a.target),
               max_steps=every * math.ceil(budget / every), eval_every=every,
               momentum=float(a.momentum))


def plan_options(planner: PlannerConfig, b: int, devices: Sequence[int]) -> dict[int, PlanOptions]:
  """The planner group at every G <= B of `devices`."""
  return {g: PlanOptions.of(planner, g, b) for g in sorted(set(devices)) if g <= b}


def predicted_steps_ms(model: ModelConfig, cluster, profile_options: ProfileConfig,
                       options: dict[int, PlanOptions], seed: int = 0) -> list[dict[str, Any]]:
  """Per G of `options`: the planner's data-parallel and burst ms per step of `model`; None,
  with the planner's reason, where no plan fits."""
  b = next(iter(options.values())).global_batch
  graph = model.graph(seed)
  profile = profiles.for_cluster(profile_options, graph, cluster.device, b, model=model)
  out = []
  for g, opts in options.items():
    cluster.with_num_devices(g)  # validates G against the pod
    try:
      p = plan_for(graph, profile, cluster, opts).predicted
    except UserError as e:  # e.g. no plan fits the devices' memory: this (B, G) is infeasible
      out.append({"num_devices": g, "data_parallel_ms": None, "burst_ms": None,
                  "infeasible": str(e)})
      continue
    out.append({"num_devices": g, "data_parallel_ms": p["data_parallel_iteration_ms"],
                "burst_ms": p["iteration_ms"]})
  return out


def noise_scales(model: ModelConfig, data, sweep, out, best: int) -> tuple[float, list[float]]:
  """B_simple at initialisation (first seed) and where each seed of the best lr reached the
  target, both over the training set."""
  x, y = data.x_train_Nx8x8x1, data.y_train_N
  scale = noise_scale_fn(out.graphdef)
  init = scale(nnx.state(model.build(seed=sweep.seeds[0]), nnx.Param), x, y)
  num_s = len(sweep.seeds)
  reached = [] if best < 0 else [j for j in range(num_s) if out.steps_LxS[best, j] >= 0]
  at_target = [scale(jax.tree.map(lambda p, r=best * num_s + j: p[r], out.params_at_target_R),
                     x, y)["b_simple"] for j in reached]
  return init["b_simple"], at_target


@dataclass(frozen=True)
class AccuracyInputs:
  """The accuracy app's config, typed and checked (decode)."""

  model: ModelConfig
  data: Any  # the digits' train/test split
  sweep: Sweep
  cluster: Any  # the ClusterConfig the step times are predicted on
  profile: ProfileConfig
  plan_options: dict[int, PlanOptions]  # the planner's options at every G <= B to plan
  what_if: list[ModelConfig]  # accuracy.step_time_models
  seed: int


def decode(cfg: AccuracyConfig) -> AccuracyInputs:
  """What the typed config describes: the data, the sweep, the planner's options per G."""
  data = digits.load(int(cfg.data_seed))
  sweep = sweep_of(cfg.accuracy, cfg.batch_size, len(data.y_train_N))
  return AccuracyInputs(cfg.model, data, sweep, cfg.cluster, cfg.profile,
                        plan_options(cfg.planner, sweep.batch, cfg.accuracy.devices),
                        [ModelConfig.named(n) for n in cfg.accuracy.step_time_models], cfg.seed)


def accuracy_task(cfg: AccuracyConfig, run: Run) -> dict[str, Any]:
  """Train the grid, pick the best learning rate, measure noise scales, predict step times."""
  inputs = decode(cfg)
  model, data, sweep = inputs.model, inputs.data, inputs.sweep
  out = convergence.train_to_target(lambda s: model.build(seed=s), data, sweep)
  best = convergence.best_lr(out.steps_LxS)
  run.log_table("steps_per_lr_seed", ["lr", "seed", "steps_to_target"],
                [[lr, s, int(out.steps_LxS[i, j])] for i, lr in enumerate(sweep.lrs)
                 for j, s in enumerate(sweep.seeds)])
  init, at_target = noise_scales(model, data, sweep, out, best)
  steps = convergence.median_steps(out.steps_LxS[best]) if best >= 0 else math.inf
  b = sweep.batch

  def predicted_for(m: ModelConfig) -> list[dict[str, Any]]:
    return predicted_steps_ms(m, inputs.cluster, inputs.profile, inputs.plan_options,
                              inputs.seed)

  predicted = predicted_for(model)
  what_if = {m.name: predicted_for(m) for m in inputs.what_if}
  run.log_table("predicted_step_ms", ["num_devices", "data_parallel_ms", "burst_ms"],
                [[p["num_devices"], p["data_parallel_ms"], p["burst_ms"]] for p in predicted])
  summary = {
      "model": model.name, "global_batch": b, "target": sweep.target,
      "best_lr": sweep.lrs[best] if best >= 0 else None,
      "best_lr_at_grid_edge": best in (0, len(sweep.lrs) - 1),
      "steps": steps if math.isfinite(steps) else None,
      "samples": steps * b if math.isfinite(steps) else None,
      "seeds_reached": len(at_target), "seeds": len(sweep.seeds),
      "steps_per_seed": [int(v) for v in out.steps_LxS[best]] if best >= 0 else [],
      "steps_run": out.steps_run, "max_steps": sweep.max_steps, "eval_every": sweep.eval_every,
      "noise_scale_init": init,
      "noise_scale_at_target": float(np.median(at_target)) if at_target else None,
      "predicted": predicted, "what_if": what_if}
  print(f"{model.name} B={b}: best lr {summary['best_lr']}, median steps {summary['steps']} "
        f"({len(at_target)}/{len(sweep.seeds)} seeds reached {sweep.target:.3f}), B_simple "
        f"{init:.1f} at init, {summary['noise_scale_at_target']} at the target")
  return summary


main = hydra_app("accuracy", AccuracyConfig)(accuracy_task)


if __name__ == "__main__":
  run_app_module("dp_jax.accuracy")
