"""Plan layouts shared by the multi-process workers and the tests that check them."""

ALL8 = range(8)


def train_multiprocess_layout(name: str):
  """Tiny GPT-2 on 8 -> 4 (2 per process) -> 1 (process 1) -> 1 (process 0) devices.

  embed's tied wte travels from the 8-device stage to lm_head on process 0 and back.
  """
  if name == "embed":
    return ALL8
  if name == "h.0":
    return [2, 3, 4, 5]
  if name in ("h.1", "ln_f"):
    return [6]
  return [1]
