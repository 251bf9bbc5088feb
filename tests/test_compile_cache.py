"""The persistent compilation cache: set once under the cache folder, inherited by children."""

import jax

from dp_jax.runtime import compile_cache


def test_the_cache_goes_under_the_cache_folder_and_an_existing_one_is_kept(tmp_path, monkeypatch):
  before = jax.config.jax_compilation_cache_dir
  monkeypatch.setenv(compile_cache.ENV, "")  # restored (or removed) after the test
  monkeypatch.delenv(compile_cache.ENV)
  try:
    jax.config.update("jax_compilation_cache_dir", None)
    assert compile_cache.use_compile_cache(tmp_path) == tmp_path / "xla"
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
    assert compile_cache.os.environ[compile_cache.ENV] == str(tmp_path / "xla")
    assert compile_cache.use_compile_cache(tmp_path / "other") == tmp_path / "xla"
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
