"""XLA's persistent compilation cache in the project's cache folder.

A program compiled once (same computation, devices and options) is read back instead of
compiled again, in this process (the profile's uncut model is the data-parallel plan's program)
and in later runs and the processes this one starts (they inherit JAX_COMPILATION_CACHE_DIR).
Compiling dominates the in-context profile's time on CPU (dp_jax/measurement/in_context.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

ENV = "JAX_COMPILATION_CACHE_DIR"


def use_compile_cache(cache_dir: str | Path) -> Path:
  """Cache compiled programs under cache_dir/xla unless a cache is already set; its folder."""
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", str(Path(cache_dir) / "xla"))
  os.environ.setdefault(ENV, jax.config.jax_compilation_cache_dir)
  return Path(jax.config.jax_compilation_cache_dir)
