import os


def minutes(item):
    """A test's rough length: ``slow(minutes=...)``, 1 for another slow test, 0 for the rest."""
    marker = item.get_closest_marker("slow")
    return 0 if marker is None else marker.kwargs.get("minutes", 1)


def pytest_collection_modifyitems(items):
    # The slow tests first, the longest first (the order is otherwise kept), so that under
    # xdist they start at once rather than last, with the short ones filling in beside them.
    items.sort(key=lambda item: -minutes(item))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        items[:] = dealt(items, workers)


def dealt(items, workers):
    """``items`` laid out for xdist's work stealing, which hands each worker a slice of the
    collection in turn (``len(left) // workers_left`` items) and steals from a slice's end, but
    leaves a worker the test after the one it runs: each slice starts with one of the longest
    tests, then a short one (to wait behind it), then its share of the rest in order."""
    if len(items) < 4 * workers:  # a few tests: nothing to gain
        return items
    heads, rest = items[:workers], items[workers:]
    short = [item for item in rest if not minutes(item)][:workers]
    rest = [item for item in rest if item not in short]
    laid_out, left = [], len(items)
    for k in range(workers):
        size = left // (workers - k)
        first = [heads[k], *short[k:k + 1]]
        share, rest = rest[:size - len(first)], rest[size - len(first):]
        laid_out += first + share
        left -= size
    return laid_out + rest
