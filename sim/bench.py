"""What every bench starts with: the clock, a reset, and its parameters."""

from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import ClockCycles

__all__ = ["start", "cycle_now"]

CLOCK_NS = 10


def cycle_now():
    """The clock cycles since the bench started (every coroutine reads the same count)."""
    return int(get_sim_time(unit="ns")) // CLOCK_NS


async def start(dut, cycles=2):
    Clock(dut.clk, CLOCK_NS, unit="ns").start()
    dut.rst.value = 1
    await ClockCycles(dut.clk, cycles)
    dut.rst.value = 0
