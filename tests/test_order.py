"""The suite's order under xdist (``tests/conftest.py``): each worker's first share starts with
one of the longest tests."""

from types import SimpleNamespace

import pytest
from xdist.scheduler import WorkStealingScheduling

from tests.conftest import dealt


class Item:
    def __init__(self, name, minutes=None):
        self.name, self.marker = name, None if minutes is None else pytest.mark.slow(minutes=minutes).mark

    def get_closest_marker(self, name):
        return self.marker if name == "slow" else None


class Worker:
    """What xdist's scheduler sees of a worker: the tests it is sent, in turn."""

    shutting_down = False

    def __init__(self, index):
        self.gateway = SimpleNamespace(id=f"gw{index}")
        self.slices = []

    def send_runtest_some(self, indices):
        self.slices.append(list(indices))

    def send_steal(self, indices):
        pass


def first_slices(collection, workers):
    """The slice of ``collection`` that xdist's own work-stealing scheduler sends each worker
    first."""
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None)
    scheduler = WorkStealingScheduling(config)
    nodes = [Worker(index) for index in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return [node.slices[0] for node in nodes]


@pytest.mark.parametrize("workers", [2, 3])
def test_each_worker_starts_with_a_long_test_and_a_short_one_behind_it(workers):
    items = [Item("build", 25), Item("demo", 8), Item("bench", 2), Item("fixture", 1)] + \
        [Item(f"quick{i}") for i in range(11)]
    laid_out = dealt(items, workers)
    assert sorted(item.name for item in laid_out) == sorted(item.name for item in items)
    for k, indices in enumerate(first_slices([item.name for item in laid_out], workers)):
        first, second = (laid_out[i] for i in indices[:2])
        assert first is items[k] and second.marker is None


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_a_few_tests_are_all_kept(count):
    items = [Item("build", 25)] + [Item(f"quick{i}") for i in range(count - 1)]
    assert sorted(item.name for item in dealt(items, 2)) == sorted(item.name for item in items)
