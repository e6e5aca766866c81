"""What every bench starts with: the clock, a reset, and its parameters."""

from cocotb.clock import Clock
from cocotb.triggers import ClockCycles

__all__ = ["start"]


async def start(dut, cycles=2):
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    await ClockCycles(dut.clk, cycles)
    dut.rst.value = 0
