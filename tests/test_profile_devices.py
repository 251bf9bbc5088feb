"""DeviceSpec registry: known devices, bad names and bad numbers are one-line UserErrors."""

import pytest

from dp_jax.base.errors import UserError
from dp_jax.hardware.devices import DEVICES, DeviceSpec, canonical_dtype, get_device, is_mixed


def test_every_device_has_positive_numbers():
  for name, d in DEVICES.items():
    assert d.name == name
    assert d.mem_bandwidth > 0 and d.memory_gb > 0 and d.compute_units >= 1
    assert d.peak("float32") > 0


def test_datasheet_numbers_a100_h200():
  a100 = get_device("A100-SXM4-40GB")
  assert a100.peak("float16") == pytest.approx(312e12)
  assert a100.mem_bandwidth == pytest.approx(1555e9)
  h200 = get_device("H200-SXM-141GB")
  assert h200.peak("bf16") == pytest.approx(989.5e12)
  assert h200.mem_bandwidth == pytest.approx(4.8e12)


def test_unknown_device_lists_valid_names():
  with pytest.raises(UserError) as e:
    get_device("TPU-v9")
  msg = str(e.value)
  assert "\n" not in msg and "TPU-v9" in msg
  for name in DEVICES:
    assert name in msg


def test_negative_bandwidth_is_one_line_error():
  with pytest.raises(UserError) as e:
    DeviceSpec("bad", {"float32": 1e12}, -1.0, 8, 5.0)
  assert "\n" not in str(e.value) and "bandwidth" in str(e.value)


def test_bad_peak_dtype_and_units():
  with pytest.raises(UserError, match="dtype 'int8'"):
    DeviceSpec("bad", {"int8": 1e12}, 1e9, 8, 5.0)
  with pytest.raises(UserError, match="compute_units"):
    DeviceSpec("bad", {"float32": 1e12}, 1e9, 8, 5.0, 0)


def test_unsupported_dtype_on_volta():
  with pytest.raises(UserError, match="no bfloat16 peak"):
    get_device("V100-SXM2-32GB").peak("bfloat16")


def test_dtype_aliases():
  assert canonical_dtype("bf16") == "bfloat16"
  assert canonical_dtype("mixed fp16") == "float16"
  assert is_mixed("mixed fp16") and not is_mixed("float16")
  with pytest.raises(UserError, match="dtype 'fp8' is unknown"):
    canonical_dtype("fp8")
