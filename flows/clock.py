"""Which clock a build asks of the PLL: the fastest at which it meets timing.

nextpnr's fmax moves by a few percent from one placement seed to the next, so a near miss is
retried with another seed before the clock steps down; a far miss steps straight down to the
fastest clock that the best placement so far reached. Only clocks the PLL makes, and at which
the UART's baud is within :data:`MAX_BAUD_ERROR`, are asked for.
"""

from dataclasses import dataclass

from boards.ulx3s import pll_clocks
from hdl.uart import divisor_for

__all__ = ["TARGET_CLOCK_HZ", "MAX_BAUD_ERROR", "NEAR_MISS", "Attempt", "usable_clocks", "fastest_clock",
           "next_attempt"]

# What the engine's pipeline is cut for (docs/timing.md): the search starts at the fastest
# usable clock at or below it.
TARGET_CLOCK_HZ = 100_000_000

MAX_BAUD_ERROR = 0.01

# A miss by less than this fraction of the clock is within seed-to-seed variation.
NEAR_MISS = 0.05


@dataclass(frozen=True)
class Attempt:
    clock_hz: float
    seed: int | None   # None: nextpnr's own
    fmax_mhz: float | None = None

    @property
    def met(self):
        return self.fmax_mhz is not None and self.fmax_mhz * 1e6 >= self.clock_hz


def usable_clocks(baud):
    """The PLL's clocks at which ``baud`` is within :data:`MAX_BAUD_ERROR`, ascending."""
    usable = []
    for hz in pll_clocks():
        try:
            if divisor_for(hz, baud)[1] <= MAX_BAUD_ERROR:
                usable.append(hz)
        except ValueError:  # too slow for the baud
            pass
    return usable


def fastest_clock(at_most_hz, baud):
    """The fastest usable clock at or below ``at_most_hz``, or ``None``."""
    return max((hz for hz in usable_clocks(baud) if hz <= at_most_hz), default=None)


def next_attempt(tried, *, baud, target_hz=TARGET_CLOCK_HZ, attempts=4, seeds_per_clock=2):
    """The next (clock, seed) to build after the attempts ``tried`` (in order, each with its
    fmax), or ``None`` when the last one met timing or no attempt is left."""
    if not tried:
        clock = fastest_clock(target_hz, baud)
        if clock is None:
            raise ValueError(f"no clock at or below {target_hz / 1e6:.2f} MHz makes {baud} baud "
                             f"within {MAX_BAUD_ERROR:.0%}")
        return Attempt(clock, None)
    last = tried[-1]
    if last.met or len(tried) >= attempts:
        return None
    at_this_clock = [attempt for attempt in tried if attempt.clock_hz == last.clock_hz]
    if last.fmax_mhz * 1e6 >= (1 - NEAR_MISS) * last.clock_hz and len(at_this_clock) < seeds_per_clock:
        used = {attempt.seed for attempt in tried}
        return Attempt(last.clock_hz, next(seed for seed in range(1, 1 << 16) if seed not in used))
    best = max(tried, key=lambda attempt: attempt.fmax_mhz)
    clock = fastest_clock(min(best.fmax_mhz * 1e6, last.clock_hz - 1), baud)
    if clock is None:
        return None
    return Attempt(clock, best.seed)
