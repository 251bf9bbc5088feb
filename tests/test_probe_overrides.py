"""Probe rows of issue 41 on overrides (in process, fast): paths Hydra's parser would split or
refuse are taken whole, a file named like a number or twice in a sweep still composes, and the
advice for a key under a null group (`background.model={name: ...}`) works."""

import pytest

from dp_jax.cli.config_files import quoted
from dp_jax.cli.hydra_app import app_config, expand_file_overrides
from dp_jax.plan import main as plan_main
from dp_jax.simulate import main as simulate_main

MODEL = "_target_: my_models.vit.ViT\nname: {name}\nimage_size: 32\n"


@pytest.mark.parametrize("stem", ["nan", "inf", "true", "é", "a,b", "my-vit"])
def test_a_model_file_of_any_name_composes(tmp_path, stem):
  path = tmp_path / f"{stem}.yaml"
  path.write_text(MODEL.format(name="my_vit"))
  cfg = app_config(plan_main, [f"model={path}", "cluster=a100_nvlink_8"])
  assert cfg.model.target == "my_models.vit.ViT" and cfg.model.image_size == 32


def test_the_same_model_file_three_times_in_a_sweep_is_one_option(tmp_path):
  path = tmp_path / "vit.yaml"
  path.write_text(MODEL.format(name="my_vit"))
  args = expand_file_overrides(["-m", f"model={path},{path},{path}"])
  model = next(a for a in args if a.startswith("model="))
  assert len(set(model.removeprefix("model=").split(","))) == 1, model


@pytest.mark.parametrize("name", ["a,b.json", "é.json", "профиль.json"])
def test_a_profile_path_with_a_comma_or_non_ascii_is_one_path(tmp_path, name):
  path = tmp_path / name
  path.write_text("{}")
  cfg = app_config(plan_main, ["model=vgg16", "cluster=a100_nvlink_8", f"profile={path}"])
  assert cfg.profile.source == "file" and cfg.profile.path == str(path)


def test_values_are_quoted_only_where_the_parser_would_misread_them(tmp_path):
  (tmp_path / "a,b.json").write_text("{}")
  assert quoted([f"out={tmp_path}/a,b.json", "out=résumé.json", "x=1,2", "-m",
                 "hydra.searchpath=[file://é]", "y='é'"]) == [
      f"out='{tmp_path}/a,b.json'", "out='résumé.json'", "x=1,2", "-m",
      "hydra.searchpath=[file://é]", "y='é'"]


def test_the_advice_for_a_key_under_a_null_background_model_works():
  """The one-line error for background.model.name=... says to give background.model whole;
  OmegaConf could not merge that into the null node ("'NoneType' object has no attribute
  'get'")."""
  cfg = app_config(simulate_main, ["model=vgg16", "cluster=dgx_a100", "background=same_family",
                                   "background.model={name: resnet50, image_size: 32}"])
  assert cfg.background.model.name == "resnet50" and cfg.background.model.image_size == 32
  preset = app_config(simulate_main, ["model=vgg16", "cluster=dgx_a100", "background=vgg16"])
  assert preset.background.model.name == "vgg16"
  alone = app_config(simulate_main, ["model=vgg16", "cluster=dgx_a100"])
  assert alone.background.model is None
