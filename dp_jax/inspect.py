"""python -m dp_jax.inspect model=resnet50 out=graph.json: the planner's view of a model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dp_jax.base.checks import REQUIRED, Checked
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.models.zoo import ModelConfig
from dp_jax.report import tables
from dp_jax.tracking.run import LoggerConfig, Run


@dataclass(frozen=True)
class InspectConfig(Checked):
  """python -m dp_jax.inspect: the layer table of a model, and its graph JSON (out: the graph
  JSON, default <output dir>/graph.json)."""

  model: ModelConfig = REQUIRED
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  out: str | None = None
  seed: int = 0


COLUMNS = ["name", "kind", "params", "output shape", "GFLOPs/sample"]


def layer_rows(graph: LayerGraph) -> list[list[Any]]:
  """One row per layer, in topological order."""
  return [[n.name, n.kind, n.params, "x".join(map(str, n.out_shape)),
           round(n.flops_per_sample / 1e9, 4)] for n in graph.nodes]


def print_layer_table(graph: LayerGraph) -> None:
  from rich.console import Console  # rich: only to print (its import is not free)

  table = tables.table(f"{graph.model}: {len(graph.nodes)} layers, "
                       f"{len(graph.fork_join_blocks())} fork/join blocks", COLUMNS,
                       [(name, kind, f"{params:,}", shape, f"{gflops:.4f}")
                        for name, kind, params, shape, gflops in layer_rows(graph)],
                       left=("kind", "output shape"))
  table.add_section()
  table.add_row("total", "", f"{graph.total_params:,}", "",
                f"{graph.total_flops_per_sample / 1e9:.4f}")
  Console(width=120).print(table)


def inspect(cfg: InspectConfig, run: Run) -> dict[str, Any]:
  """Trace the model, print its layer table, write the graph JSON, log the table."""
  out = Path(cfg.out) if cfg.out else run.output_dir / "graph.json"
  graph = cfg.model.graph(cfg.seed)
  print_layer_table(graph)
  graph.save(out)
  run.log_table("layers", COLUMNS, layer_rows(graph))
  print(f"graph: {out}")
  return {"model": graph.model, "layers": len(graph.nodes), "params": graph.total_params,
          "gflops_per_sample": graph.total_flops_per_sample / 1e9,
          "fork_join_blocks": len(graph.fork_join_blocks()), "graph": str(out)}


main = hydra_app("inspect", InspectConfig)(inspect)


if __name__ == "__main__":
  run_app_module("dp_jax.inspect")
