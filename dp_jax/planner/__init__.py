"""Planner: burst-parallel search, data-parallel baseline and the Plan they produce (no JAX)."""

from dp_jax.planner.contract import PLAN_SCHEMA, LayerPlan, Plan
from dp_jax.planner.evaluate import Evaluation, evaluate, evaluate_plan
from dp_jax.planner.frontier import DEFAULT_LIMITS, FrontierPoint, pareto
from dp_jax.planner.make import (
  data_parallel_plan,
  idle_device_limit,
  make_plan,
  plan_for,
  plan_for_limit,
  plan_with,
  plan_with_idle_device,
)
from dp_jax.planner.options import PlanOptions, candidate_counts

__all__ = ["DEFAULT_LIMITS", "PLAN_SCHEMA", "Evaluation", "FrontierPoint", "LayerPlan", "Plan",
           "PlanOptions", "candidate_counts", "data_parallel_plan", "evaluate", "evaluate_plan",
           "idle_device_limit", "make_plan", "pareto", "plan_for", "plan_for_limit", "plan_with",
           "plan_with_idle_device"]
