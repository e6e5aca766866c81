"""Progress of long work (a simulation, a build) on stderr: a line when its stage changes, and
every half minute while it runs, each with the seconds since it started."""

import contextlib
import sys
import threading
import time

__all__ = ["shown_progress"]

INTERVAL = 30  # seconds between two lines of the same stage


@contextlib.contextmanager
def shown_progress(status):
    """Within the block, ``status()`` (a ``(stage, detail)`` pair; ``detail`` may be ``None``) is
    read every second: a line when the stage changes, and every ``INTERVAL`` seconds; and a last
    line as the block ends, where it shows a detail not shown yet."""
    started = time.monotonic()
    done = threading.Event()
    shown = [None, None, 0.0]  # the stage and detail last shown, and when

    def show(force=False):
        stage, detail = status()
        elapsed = time.monotonic() - started
        if stage != shown[0] or elapsed - shown[2] >= INTERVAL or (force and detail != shown[1]):
            print(f"  [{elapsed:4.0f} s] {stage}{f': {detail}' if detail else ''}", file=sys.stderr, flush=True)
            shown[:] = [stage, detail, elapsed]

    def watch():
        while not done.wait(1):
            show()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        show(force=True)
