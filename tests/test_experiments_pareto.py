"""experiments/pareto.py: which (iteration_ms, gpu_ms) points no other point beats on both."""

from experiments.pareto import dominated, on_front


def test_dominated_needs_one_strict_improvement():
  assert dominated((2.0, 2.0), (1.0, 2.0))
  assert not dominated((2.0, 2.0), (2.0, 2.0))
  assert not dominated((1.0, 3.0), (2.0, 2.0))


def test_front_keeps_the_trade_off_and_equal_points():
  points = [(1.0, 10.0), (2.0, 5.0), (3.0, 5.0), (4.0, 1.0), (2.0, 5.0)]
  assert on_front(points) == [True, True, False, True, True]


def test_one_point_is_its_own_front():
  assert on_front([(3.0, 4.0)]) == [True]
