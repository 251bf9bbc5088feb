"""The burst-parallel train step: one jitted program per stage, device_put between stages.

Forward and backward (exact: the same gradients, to rounding):
  - every stage but the last runs `fwd`: its layers under jax.vjp inside one jit. It returns
    the exported activations, the VJP (its residuals are outputs of the jit and stay on the
    stage's devices) and the new batch-norm statistics. The residuals are only the layers'
    matmul and convolution outputs (runtime/residuals.py: jax.checkpoint with that policy);
    `bwd` recomputes the cheap rest from them. saveable_args=False keeps the params
    and inputs out of the residuals (no copies); `bwd` receives them again and restores them
    with vjp.replace(args_res=[...]) in their original structure. Both are public, documented
    parts of jax.vjp (its docstring, and JAX's "First-class VJPs" guide: the VJP object is a
    pytree of its residuals, so it can leave one jit and enter another).
  - the last stage runs `fused`: forward, loss (mean over the global batch), backward and
    optimizer update in one program.
  - `bwd` applies a stage's VJP to the sum of the cotangents its exports received from later
    stages, adds the gradients other stages computed for its tied params, and updates it.
Sharding: a stage's mesh is 2-D (data, model); the batch is split over "data" and every
param is replicated unless the plan splits it over "model" (runtime/layout.py). GSPMD inserts
the split layers' collectives and all-reduces parameter gradients over "data" inside the
stage's own program; exports leave every stage as PartitionSpec("data").
Transfers: transfer.move (jax.device_put in one process; a jit over the union of both device
sets when they live on several processes) moves activations forward and cotangents backward
between meshes (a no-op when both stages share a device set). Dispatch is asynchronous: stages
on disjoint devices (fork/join branches) run concurrently; host-side nothing waits until the loss.
Tied params (GPT-2's lm_head reading embed's wte): the owner is the first layer holding the
Param; a later stage reading it gets a replicated copy each step and sends its gradient back,
where it is summed into the owner's gradient before the update.
Per-layer strategies (the plan's LayerSharding and LayerPlan.recompute; docs/runtime.md): state
optimizer / full shards the optimizer state / also the params over "data" (runtime/layout.py;
the forward reads full-state params gathered, the update reads gradients split as the state);
recompute wraps the layer's forward in jax.checkpoint; split experts runs the layer's routed
experts with all-to-alls (runtime/experts.py). Dropped-token counts of MoE layers leave the
stage programs with the new statistics (under DROPPED) and train_step hands them to `counts`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.planner.contract import Plan
from dp_jax.planner.sharding import LayerSharding
from dp_jax.runtime import experts, layout, residuals, transfer
from dp_jax.runtime import mesh as meshlib
from dp_jax.runtime.functional import LayerDef, apply_layer
from dp_jax.runtime.loss import cross_entropy
from dp_jax.runtime.stages import INPUT, Stage, plan_stages

# A stage's forward/backward programs donate buffers XLA cannot always reuse (a layer's output
# of another shape): a performance note, not a fault, printed at every first compile.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")

TrainState = dict[str, dict[str, Any]]  # {"params"|"stats"|"opt": {layer: ...}}
DROPPED = "<dropped>"  # a layer's new-stats entry: assignments it dropped (not a statistic)


@dataclass(frozen=True, eq=False)
class StageProgram:
  """A stage's mesh, shardings and compiled programs (fwd + bwd, or fused if last)."""

  stage: Stage
  mesh: Mesh
  batch: NamedSharding
  replicated: NamedSharding
  tied_in: tuple[str, ...]  # tied values (owner:key) this stage reads from other stages
  tied_owned: tuple[str, ...]  # its params that later stages read (gradients come back)
  fwd: Callable | None
  bwd: Callable | None
  fused: Callable | None
  layouts: Mapping[str, layout.Shardings] = dataclasses.field(default_factory=dict)  # by layer
  tied_sharding: Mapping[str, NamedSharding] = dataclasses.field(default_factory=dict)
  # by layer: stored / compute / optimizer-state shardings (layouts = their stored ones)
  layer_layouts: Mapping[str, layout.LayerLayout] = dataclasses.field(default_factory=dict)
  shardings: Mapping[str, LayerSharding] = dataclasses.field(default_factory=dict)  # plan's
  recompute: frozenset[str] = frozenset()  # layers whose forward runs again in the backward


@dataclass(frozen=True, eq=False)
class Program:
  """Every stage of a plan, compiled lazily by jax.jit on first call."""

  model: str
  stages: tuple[StageProgram, ...]
  defs: Mapping[str, LayerDef]
  stage_of: Mapping[str, int]
  global_batch: int
  num_devices: int  # of the plan (device indices 0..num_devices-1)
  everywhere: NamedSharding | None = None  # replicated on all the plan's devices

  def value(self, a: jax.Array):
    """The full value of `a` as numpy on this process (moved across processes if needed)."""
    return transfer.local_value(a, self.everywhere)

  @property
  def input_stage(self) -> StageProgram:
    return next(s for s in self.stages if INPUT in s.stage.inputs)

  @property
  def last_stage(self) -> StageProgram:
    return self.stages[-1]


def tied_key(owner: str, key: str) -> str:
  return f"{owner}:{key}"


def build_program(graph: LayerGraph, defs: Mapping[str, LayerDef], plan: Plan,
                  optimizer: optax.GradientTransformation,
                  devices: list[jax.Device], breaks: Collection[str] = ()) -> Program:
  """The plan's stages (its recorded ones, as the runtime runs them: runtime/stages.py) and
  each stage's jitted programs on its sub-mesh (a layer in `breaks` starts a new stage).
  `plan`: checked by planner.contract.check_plan."""
  stages = plan_stages(graph, plan, breaks)
  stage_of = {n: s.index for s in stages for n in s.layers}
  reads: dict[int, list[str]] = {s.index: [] for s in stages}
  owned: dict[int, list[str]] = {s.index: [] for s in stages}
  for d in defs.values():
    for owner, key in d.tied.values():
      t, si, so = tied_key(owner, key), stage_of[d.name], stage_of[owner]
      if si < so:
        raise UserError(f"layer '{d.name}' reads parameter '{key}' of layer '{owner}', which "
                        "runs in a later stage; place them so the owner runs first")
      if si != so and t not in reads[si]:
        reads[si].append(t)
      if si != so and t not in owned[so]:
        owned[so].append(t)
  programs = []
  for s in stages:
    last = s.index == len(stages) - 1
    programs.append(stage_program(
        s, [devices[i] for i in s.devices], defs, optimizer, graph.sink if last else None,
        reads[s.index], owned[s.index],
        shardings={n: plan.placements[n].sharding for n in s.layers},
        recompute=[n for n in s.layers if plan.placements[n].recompute]))
  everywhere = transfer.replicated_everywhere(devices[:plan.num_devices])
  return Program(graph.model, tuple(programs), defs, stage_of, plan.global_batch,
                 plan.num_devices, everywhere)


def stage_program(stage: Stage, devices: list[jax.Device], defs: Mapping[str, LayerDef],
                  optimizer: optax.GradientTransformation, sink: str | None,
                  tied_in: Collection[str] = (), tied_owned: Collection[str] = (),
                  loss_of: Callable = cross_entropy,
                  shardings: Mapping[str, LayerSharding] | None = None,
                  recompute: Collection[str] = ()) -> StageProgram:
  """One stage's programs on the (stage.mesh_shape) mesh of `devices`: fused
  (loss_of(outs[sink], y)) when `sink` is given, as the last stage runs; else forward and
  backward. shardings: per layer, its plan entry (split, parameter specs, state; none:
  samples, replicated); recompute: layers whose forward runs again in the backward."""
  m = meshlib.stage_mesh(devices, stage.mesh_shape)
  # non-plain entries only: a stage of plain layers compiles as it did before strategies
  shardings = {n: sh for n, sh in (shardings or {}).items()
               if n in stage.layers and not sh.plain}
  for n, sh in shardings.items():
    if tuple(sh.mesh) != tuple(m.devices.shape):
      raise UserError(f"plan layer '{n}': mesh {list(sh.mesh)} differs from its stage's "
                      f"{list(m.devices.shape)}; the runtime runs a layer on its own mesh")
  lays = {n: layout.layer_layout(m, defs[n], shardings.get(n)) for n in stage.layers}
  lay = {n: ll.stored for n, ll in lays.items()}
  tied_sh = {tied_key(*defs[n].tied[k]): lays[n].compute[k] for n in stage.layers
             for k in defs[n].tied}
  splits = {shardings[n].split if n in shardings else "samples" for n in stage.layers}
  # a stage of experts-split layers only takes and returns its tokens split over both axes
  batch = (meshlib.spec_sharding(m, list(experts.TOKENS)) if splits == {"experts"}
           else meshlib.batch_sharding(m))
  sp = StageProgram(stage, m, batch, meshlib.replicated(m), tuple(tied_in), tuple(tied_owned),
                    None, None, None, lay, tied_sh, lays, shardings,
                    frozenset(n for n in recompute if n in stage.layers))
  return dataclasses.replace(sp, **_stage_functions(sp, defs, optimizer, sink, loss_of))


def init_state(program: Program, params: Mapping[str, Any], stats: Mapping[str, Any],
               optimizer: optax.GradientTransformation) -> TrainState:
  """Params and stats replicated on each layer's stage mesh; optimizer state made there."""
  state: TrainState = {"params": {}, "stats": {}, "opt": {}}
  for sp in program.stages:
    layers = sp.stage.layers
    p = {n: layout.place(params[n], sp.layouts[n]) for n in layers}
    st = {n: layout.place(stats[n], sp.layouts[n]) for n in layers}
    opt_sh = {n: layout.opt_shardings(jax.eval_shape(optimizer.init, v), v,
                                      _layer_layout(sp, n).opt, sp.replicated)
              for n, v in p.items()}
    init = jax.jit(lambda p: {n: optimizer.init(v) for n, v in p.items()}, out_shardings=opt_sh)
    state["params"].update(p)
    state["stats"].update(st)
    state["opt"].update(init(p))
  return state


def train_step(program: Program, state: TrainState, x: jax.Array, y: jax.Array,
               timer: list[dict[str, Any]] | None = None,
               on_stage: Callable | None = None,
               counts: dict[str, jax.Array] | None = None) -> tuple[TrainState, jax.Array]:
  """One step: (new state, loss on the last stage); with `timer`, waits on and records each call.

  on_stage(stage_program, phase) is called just before each stage call (fwd | fwd_bwd | bwd).
  counts: filled with layer -> the token-expert assignments it dropped by capacity this step
  (a scalar array; only MoE layers whose capacity can drop any).
  """
  stages, n = program.stages, len(program.stages)
  params, stats, opt = dict(state["params"]), dict(state["stats"]), dict(state["opt"])
  acts: dict[str, jax.Array] = {}
  saved: dict[int, tuple[Any, ...]] = {}
  call = _timed_call(timer)
  if on_stage is not None:
    call = _hooked_call(call, on_stage)
  for sp in stages[:-1]:
    tied, ins = call(sp, "transfer_fwd", _gather_inputs, sp, params, acts)
    x_in = x if INPUT in sp.stage.inputs else None
    p, st = _select(params, sp), _select(stats, sp)
    outs, vjp, new_stats = call(sp, "fwd", sp.fwd, p, st, tied, ins, x_in)
    stats.update(_counted(new_stats, counts))
    acts.update(outs)
    saved[sp.stage.index] = (vjp, tied, ins)
  sp = stages[-1]
  tied, ins = call(sp, "transfer_fwd", _gather_inputs, sp, params, acts)
  x_in = x if INPUT in sp.stage.inputs else None
  loss, new_p, new_st, new_opt, g_tied, g_ins = call(
      sp, "fwd_bwd", sp.fused, _select(params, sp), _select(stats, sp), _select(opt, sp), tied,
      ins, x_in, y, {})
  params.update(new_p)
  stats.update(_counted(new_st, counts))
  opt.update(new_opt)
  cots: dict[str, list[jax.Array]] = {}
  tied_grads: dict[str, list[jax.Array]] = {}
  call(sp, "transfer_bwd", _send_back, program, g_tied, g_ins, cots, tied_grads)
  for i in range(n - 2, -1, -1):
    sp = stages[i]
    vjp, tied, ins = saved.pop(i)
    ct = {e: tuple(cots.pop(e)) for e in sp.stage.exports}
    extra = {t: tuple(tied_grads.pop(t)) for t in sp.tied_owned}
    new_p, new_opt, g_tied, g_ins = call(sp, "bwd", sp.bwd, vjp, ct, _select(params, sp), tied,
                                         ins, _select(opt, sp), extra)
    params.update(new_p)
    opt.update(new_opt)
    call(sp, "transfer_bwd", _send_back, program, g_tied, g_ins, cots, tied_grads)
  return {"params": params, "stats": stats, "opt": opt}, loss


def _counted(new_stats: Mapping[str, Mapping[str, Any]], counts: dict[str, Any] | None
             ) -> dict[str, dict[str, Any]]:
  """A stage's new statistics without the DROPPED entries, which go to `counts`."""
  out = {}
  for n, st in new_stats.items():
    out[n] = {k: v for k, v in st.items() if k != DROPPED}
    if DROPPED in st and counts is not None:
      counts[n] = st[DROPPED]
  return out


def _layer_layout(sp: StageProgram, name: str) -> layout.LayerLayout:
  """A layer's LayerLayout (a StageProgram made without them: its layouts, state replicated)."""
  if name in sp.layer_layouts:
    return sp.layer_layouts[name]
  lay = sp.layouts[name]
  return layout.LayerLayout(lay, lay, lay)


def _select(tree: Mapping[str, Any], sp: StageProgram) -> dict[str, Any]:
  return {n: tree[n] for n in sp.stage.layers}


def _gather_inputs(sp: StageProgram, params, acts):
  """Tied values and activations this stage reads, moved onto its mesh (one call each)."""
  tied = {}
  for t in sp.tied_in:
    owner, key = t.split(":", 1)
    tied[t] = params[owner][key]
  ins = {p: acts[p] for p in sp.stage.inputs if p != INPUT}
  tied = {t: transfer.move(v, sp.tied_sharding.get(t, sp.replicated)) for t, v in tied.items()}
  return tied, transfer.move(ins, sp.batch)


def _send_back(program: Program, g_tied, g_ins, cots, tied_grads) -> list[jax.Array]:
  """Move cotangents of a stage's inputs (and tied values) to their producers' meshes."""
  moved = []
  for p, g in g_ins.items():
    dst = program.stages[program.stage_of[p]]
    moved.append(transfer.move(g, dst.batch))
    cots.setdefault(p, []).append(moved[-1])
  for t, g in g_tied.items():
    owner, key = t.split(":", 1)
    moved.append(transfer.move(g, program.stages[program.stage_of[owner]].layouts[owner][key]))
    tied_grads.setdefault(t, []).append(moved[-1])
  return moved


def _hooked_call(call, on_stage: Callable):
  """`call`, with on_stage(sp, phase) first for stage calls (not transfers); a hook with a true
  `wait_for_stages` also has each stage call waited for (the hook then sees execution)."""
  wait = bool(getattr(on_stage, "wait_for_stages", False))

  def hooked(sp: StageProgram, phase: str, fn, *args):
    if phase.startswith("transfer"):
      return call(sp, phase, fn, *args)
    on_stage(sp, phase)
    out = call(sp, phase, fn, *args)
    return jax.block_until_ready(out) if wait else out

  return hooked


def _timed_call(timer: list[dict[str, Any]] | None):
  if timer is None and jax.process_count() > 1:
    # Several processes: each call completes before the next is issued, so every process
    # runs the cross-process collectives in one order (concurrent ones deadlocked on CPU).
    return lambda sp, phase, fn, *args: jax.block_until_ready(fn(*args))
  if timer is None:
    return lambda sp, phase, fn, *args: fn(*args)

  def call(sp: StageProgram, phase: str, fn, *args):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    timer.append({"stage": sp.stage.index, "phase": phase, "start_s": start,
                  "end_s": time.perf_counter()})
    return out

  return call


# --- per-stage programs ---------------------------------------------------------------------


def _stage_functions(sp: StageProgram, defs: Mapping[str, LayerDef],
                     optimizer: optax.GradientTransformation, sink: str | None,
                     loss_of: Callable = cross_entropy) -> dict[str, Any]:
  stage, batch = sp.stage, sp.batch

  lays = {n: _layer_layout(sp, n) for n in stage.layers}
  sharded_state = {n for n in stage.layers
                   if n in sp.shardings and sp.shardings[n].state != "replicated"}
  runs: list[tuple[str, ...]] = []  # each recompute layer alone, the layers between together
  for name in stage.layers:
    if runs and name not in sp.recompute and runs[-1][-1] not in sp.recompute:
      runs[-1] += (name,)
    else:
      runs.append((name,))

  def layer(name, params, stats, tied, args):
    """One layer's output and new stats (DROPPED: assignments an MoE layer dropped)."""
    d = defs[name]
    p = _gathered(params[name], lays[name])  # state full: gathered over "data"
    for key, (owner, okey) in d.tied.items():
      p[key] = (_gathered({key: params[owner][okey]}, lays[name], lays[owner].gathers)[key]
                if owner in params else tied[tied_key(owner, okey)])
    split = sp.shardings[name].split if name in sp.shardings else "samples"
    run = (functools.partial(experts.apply_expert_parallel, sp.mesh) if split == "experts"
           else apply_layer)
    out, st = run(d, p, stats, args)
    st = layout.constrain(st, sp.layouts[name])
    dropped = experts.dropped(d, p, stats, args)
    return out, st if dropped is None else {**st, DROPPED: dropped}

  def forward(params, stats, tied, ins, x, policy=None):
    """The stage's exports and new stats. Its layers run in pieces (runs): each recompute
    layer alone under jax.checkpoint (it keeps its inputs, its forward runs again in the
    backward), the layers between them together, under jax.checkpoint with `policy` if given
    (a stage's fwd: a checkpoint around the whole stage would decide for the recompute layers
    too, keeping their matmul outputs)."""
    env = dict(ins)
    if x is not None:
      env[INPUT] = x
    new_stats = {}
    for names in runs:
      def run(params, stats, tied, env_in, names=names):
        local, outs, sts = dict(env_in), {}, {}
        for name in names:
          args = [local[i] for i in defs[name].inputs] if defs[name].inputs else [local[INPUT]]
          local[name], sts[name] = layer(name, params, stats[name], tied, args)
          outs[name] = local[name]
        return outs, sts

      if names[0] in sp.recompute:
        run = jax.checkpoint(run)
      elif policy is not None:
        run = jax.checkpoint(run, policy=policy)
      needed = {i: env[i] for n in names for i in (defs[n].inputs or (INPUT,)) if i not in names}
      outs, sts = run(params, {n: stats[n] for n in names}, tied, needed)
      env.update(outs)
      new_stats.update(sts)
    outs = {e: jax.lax.with_sharding_constraint(env[e], batch) for e in stage.exports}
    return outs, new_stats

  def update(params, grads, opt, extra):
    grads = {n: dict(g) for n, g in grads.items()}
    for t, contributions in extra.items():
      owner, key = t.split(":", 1)
      for g in contributions:
        grads[owner][key] = grads[owner][key] + g
    new_params, new_opt = {}, {}
    for name in stage.layers:
      ll, strict = lays[name], name in sharded_state
      g = layout.constrain(grads[name], ll.opt) if strict else grads[name]  # reduce-scattered
      upd, o = optimizer.update(g, opt[name], params[name])
      new_opt[name] = layout.constrain_opt(o, params[name], ll.opt, sp.replicated)
      new_params[name] = layout.constrain(optax.apply_updates(params[name], upd), ll.stored,
                                          strict=strict)  # ZeRO-1: all-gathered
    return new_params, new_opt

  def at_boundary(g_ins):  # cotangents of a split layer's stage leave split by samples only
    if not layout.is_sharded(sp.layouts) and not sp.shardings:
      return g_ins
    return {k: jax.lax.with_sharding_constraint(v, batch) for k, v in g_ins.items()}

  if sink is not None:
    def fused(params, stats, opt, tied, ins, x, y, extra):
      def loss_fn(params, tied, ins):
        outs, new_stats = forward(params, stats, tied, ins, x)
        return loss_of(outs[sink], y), new_stats

      (loss, new_stats), (g_p, g_tied, g_ins) = jax.value_and_grad(
          loss_fn, argnums=(0, 1, 2), has_aux=True)(params, tied, ins)
      new_params, new_opt = update(params, g_p, opt, extra)
      return loss, new_params, new_stats, new_opt, g_tied, at_boundary(g_ins)

    return {"fused": jax.jit(fused, donate_argnums=(0, 1, 2))}

  def fwd(params, stats, tied, ins, x):
    if sp.recompute:  # each run under its own checkpoint
      f = lambda params, tied, ins: forward(params, stats, tied, ins, x, residuals.saved)  # noqa: E731
    else:
      f = jax.checkpoint(lambda params, tied, ins: forward(params, stats, tied, ins, x),
                         policy=residuals.saved)
    outs, vjp, new_stats = jax.vjp(f, params, tied, ins, has_aux=True, saveable_args=False)
    return outs, vjp, new_stats

  def bwd(vjp, cots, params, tied, ins, opt, extra):
    vjp = vjp.replace(args_res=[params, tied, ins])  # restore what saveable_args left out
    ct = {e: _sum(cs) for e, cs in cots.items()}
    g_p, g_tied, g_ins = vjp(ct)
    new_params, new_opt = update(params, g_p, opt, extra)
    return new_params, new_opt, g_tied, at_boundary(g_ins)

  return {"fwd": jax.jit(fwd, donate_argnums=(1,)),
          "bwd": jax.jit(bwd, donate_argnums=(0, 2, 5))}


def _gathered(arrays: Mapping[str, Any], lay: layout.LayerLayout, gathers: bool | None = None
              ) -> dict[str, Any]:
  """A layer's arrays with its compute shardings: parameters stored split over "data"
  (state full) all-gathered there (inside a checkpoint: again in the backward)."""
  if not (lay.gathers if gathers is None else gathers):
    return dict(arrays)
  return layout.constrain(arrays, {k: lay.compute[k] for k in arrays}, strict=True)


def _sum(arrays):
  total = arrays[0]
  for a in arrays[1:]:
    total = total + a
  return total

