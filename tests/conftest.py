def pytest_collection_modifyitems(items):
    # The slow tests first (the order is otherwise kept), so that under xdist the longest
    # ones start at once rather than last, with the short ones filling in beside them.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
