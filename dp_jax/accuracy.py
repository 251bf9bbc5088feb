"""python -m dp_jax.accuracy: steps to a target test accuracy on the digits at one global batch.

    python -m dp_jax.accuracy model=digits_mlp batch_size=32 accuracy.target=0.97

Trains every learning rate x seed of `accuracy` at global batch B (dp_jax/studies/convergence.py),
keeps the learning rate with the fewest median steps, measures the simple gradient noise scale
at initialisation and where its runs reached the target (dp_jax/studies/noise_scale.py), and asks
the
planner for the predicted time per step of data parallelism and of the burst plan at B on each
G of accuracy.devices (G <= B) for the model on `cluster` with `profile`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from dp_jax.base.errors import UserError
from dp_jax.config.hydra_app import hydra_app
from dp_jax.config.schema import (
  ClusterConfig,
  LoggerConfig,
  ModelConfig,
  PlannerConfig,
  ProfileConfig,
)
from dp_jax.tracking.run import Run


@dataclass
class AccuracySettings:
  """The learning-rate grid, seeds, target and budget of one batch size."""

  target: float = 0.97  # test accuracy
  # the grid at B = lr_reference_batch; at B it is scaled by (B / lr_reference_batch)^lr_batch_power
  lrs: list[float] = field(default_factory=lambda: [2.0 ** (k / 2) for k in range(-13, -3)])
  lr_reference_batch: int = 32
  lr_batch_power: float = 0.5
  seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
  momentum: float = 0.9
  max_epochs: float = 40.0  # step budget: max_epochs x training examples / B
  eval_every_samples: int = 128  # test accuracy every max(1, this // B) steps
  devices: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])  # G to plan
  # zoo models (default sizes) whose predicted step time is also reported, for a hypothetical
  # "these steps(B), that model's step" combination
  step_time_models: list[str] = field(default_factory=list)


@dataclass
class AccuracyConfig:
  """python -m dp_jax.accuracy: steps to a target accuracy at one B, and predicted step times."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  accuracy: AccuracySettings = field(default_factory=AccuracySettings)
  batch_size: int = 32
  data_seed: int = 0  # the train/test split
  seed: int = 0  # unused by training (accuracy.seeds); kept for the shared provenance columns


def sweep_of(cfg: AccuracyConfig, num_train: int):
  """The convergence.Sweep the config describes for `num_train` training examples."""
  from dp_jax.studies.convergence import Sweep

  a, b = cfg.accuracy, int(cfg.batch_size)
  if b < 1:
    raise UserError(f"batch_size must be >= 1, got {b}")
  if a.max_epochs <= 0 or a.eval_every_samples < 1 or a.lr_reference_batch < 1:
    raise UserError(f"accuracy.max_epochs ({a.max_epochs}), accuracy.eval_every_samples "
                    f"({a.eval_every_samples}) and accuracy.lr_reference_batch "
                    f"({a.lr_reference_batch}) must be positive")
  every = max(1, a.eval_every_samples // b)
  budget = math.ceil(a.max_epochs * num_train / b)
  scale = (b / a.lr_reference_batch) ** a.lr_batch_power
  return Sweep(batch=b, lrs=tuple(float(x) * scale for x in a.lrs),
               seeds=tuple(int(s) for s in a.seeds), target=float(a.target),
               max_steps=every * math.ceil(budget / every), eval_every=every,
               momentum=float(a.momentum))


def predicted_steps_ms(cfg: AccuracyConfig, model_cfg: Any = None) -> list[dict[str, Any]]:
  """Per G <= B of accuracy.devices: the planner's data-parallel and burst ms per step of the
  trained model (or of model_cfg); None, with the planner's reason, where no plan fits."""
  from omegaconf import OmegaConf

  from dp_jax.config import workflow

  if model_cfg is not None:
    cfg = OmegaConf.merge(cfg, {"model": model_cfg})
  cluster = workflow.cluster_spec(cfg.cluster)
  graph = workflow.load_graph(cfg)
  b = int(cfg.batch_size)
  profile = workflow.load_profile_for(cfg, graph, cluster, b)
  out = []
  for g in sorted({int(g) for g in cfg.accuracy.devices}):
    if g > b:
      continue
    cluster.with_num_devices(g)  # validates G against the pod
    try:
      p = workflow.make_plan_from_config(cfg.planner, graph, profile, cluster, num_devices=g,
                                         global_batch=b).predicted
    except UserError as e:  # e.g. no plan fits the devices' memory: this (B, G) is infeasible
      out.append({"num_devices": g, "data_parallel_ms": None, "burst_ms": None,
                  "infeasible": str(e)})
      continue
    out.append({"num_devices": g, "data_parallel_ms": p["data_parallel_iteration_ms"],
                "burst_ms": p["iteration_ms"]})
  return out


def zoo_model(name: str) -> dict[str, Any]:
  """The model config of zoo model `name` at its own sizes (replacing the trained model's)."""
  from dp_jax.models import zoo

  if name not in zoo.ZOO:
    raise UserError(f"accuracy.step_time_models: unknown model '{name}'; valid models: "
                    f"{', '.join(zoo.MODEL_NAMES)}")
  return {"_target_": zoo.ZOO[name], "name": name, "kwargs": {},
          **dict.fromkeys(zoo.SIZE_KEYS)}


def noise_scales(cfg: AccuracyConfig, data, sweep, out, best: int) -> tuple[float, list[float]]:
  """B_simple at initialisation (first seed) and where each seed of the best lr reached the
  target, both over the training set."""
  import jax
  from flax import nnx

  from dp_jax.models import zoo
  from dp_jax.studies.noise_scale import noise_scale_fn

  x, y = data.x_train_Nx8x8x1, data.y_train_N
  scale = noise_scale_fn(out.graphdef)
  init = scale(nnx.state(zoo.build(cfg.model, seed=sweep.seeds[0]), nnx.Param), x, y)
  num_s = len(sweep.seeds)
  reached = [] if best < 0 else [j for j in range(num_s) if out.steps_LxS[best, j] >= 0]
  at_target = [scale(jax.tree.map(lambda p, r=best * num_s + j: p[r], out.params_at_target_R),
                     x, y)["b_simple"] for j in reached]
  return init["b_simple"], at_target


def accuracy_task(cfg: AccuracyConfig, run: Run) -> dict[str, Any]:
  """Train the grid, pick the best learning rate, measure noise scales, predict step times."""
  import numpy as np

  from dp_jax.models import zoo
  from dp_jax.studies import convergence, digits

  if cfg.model.name not in ("digits_cnn", "digits_mlp"):
    raise UserError(f"the accuracy app trains on the 8x8 digits; model '{cfg.model.name}' is "
                    "not a digits model (use model=digits_mlp or model=digits_cnn)")
  data = digits.load(int(cfg.data_seed))
  sweep = sweep_of(cfg, len(data.y_train_N))
  out = convergence.train_to_target(lambda s: zoo.build(cfg.model, seed=s), data, sweep)
  best = convergence.best_lr(out.steps_LxS)
  run.log_table("steps_per_lr_seed", ["lr", "seed", "steps_to_target"],
                [[lr, s, int(out.steps_LxS[i, j])] for i, lr in enumerate(sweep.lrs)
                 for j, s in enumerate(sweep.seeds)])
  init, at_target = noise_scales(cfg, data, sweep, out, best)
  steps = convergence.median_steps(out.steps_LxS[best]) if best >= 0 else math.inf
  predicted = predicted_steps_ms(cfg)
  what_if = {name: predicted_steps_ms(cfg, zoo_model(name))
             for name in cfg.accuracy.step_time_models}
  run.log_table("predicted_step_ms", ["num_devices", "data_parallel_ms", "burst_ms"],
                [[p["num_devices"], p["data_parallel_ms"], p["burst_ms"]] for p in predicted])
  b = sweep.batch
  summary = {
      "model": cfg.model.name, "global_batch": b, "target": sweep.target,
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
  print(f"{cfg.model.name} B={b}: best lr {summary['best_lr']}, median steps {summary['steps']} "
        f"({len(at_target)}/{len(sweep.seeds)} seeds reached {sweep.target:.3f}), B_simple "
        f"{init:.1f} at init, {summary['noise_scale_at_target']} at the target")
  return summary


main = hydra_app("accuracy", AccuracyConfig)(accuracy_task)


if __name__ == "__main__":
  main()
