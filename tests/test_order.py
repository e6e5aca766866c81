"""The suite's order under xdist (``tests/conftest.py``): each worker's first share starts with
one of the longest tests."""

import pytest

from tests.conftest import dealt


class Item:
    def __init__(self, name, minutes=None):
        self.name, self.marker = name, None if minutes is None else pytest.mark.slow(minutes=minutes).mark

    def get_closest_marker(self, name):
        return self.marker if name == "slow" else None


@pytest.mark.parametrize("workers", [2, 3])
def test_each_worker_starts_with_a_long_test_and_a_short_one_behind_it(workers):
    items = [Item("build", 25), Item("demo", 8), Item("bench", 2), Item("fixture", 1)] + \
        [Item(f"quick{i}") for i in range(11)]
    laid_out = dealt(items, workers)
    assert sorted(item.name for item in laid_out) == sorted(item.name for item in items)
    start = 0
    for k in range(workers):  # as xdist's work stealing hands out the slices
        size = (len(items) - start) // (workers - k)
        first, second = laid_out[start:start + 2]
        assert first is items[k] and second.marker is None
        start += size


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_a_few_tests_are_all_kept(count):
    items = [Item("build", 25)] + [Item(f"quick{i}") for i in range(count - 1)]
    assert sorted(item.name for item in dealt(items, 2)) == sorted(item.name for item in items)
