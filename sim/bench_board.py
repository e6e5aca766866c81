"""The simulated board: the device top under Icarus Verilog, its serial line on a pseudo-terminal.

The host opens the pseudo-terminal with pyserial, exactly as it opens the board's USB serial
port, and the bench turns bytes into bits on ``rx`` and bits on ``tx`` back into bytes, at the
simulated UART's divisor. It serves until its launcher goes away.
"""

import os
import tty
from pathlib import Path

import cocotb
from cocotb.triggers import ClockCycles, FallingEdge, Timer

from .bench import start
from .runner import bench_params

PERIOD_NS = 10


async def to_host(dut, master, divisor):
    """Decode bytes from the device's ``tx`` and write them to the pseudo-terminal."""
    bit = divisor * PERIOD_NS
    while True:
        await FallingEdge(dut.tx)
        await Timer(bit + bit // 2, "ns")  # the middle of data bit 0
        byte = 0
        for i in range(8):
            byte |= int(dut.tx.value) << i
            await Timer(bit, "ns")
        # Now in the stop bit.
        os.write(master, bytes([byte]))


async def send_byte(dut, byte, divisor):
    bit = divisor * PERIOD_NS
    for level in [0] + [(byte >> i) & 1 for i in range(8)] + [1]:
        dut.rx.value = level
        await Timer(bit, "ns")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@cocotb.test()
async def serve(dut):
    params = bench_params()
    divisor = params["divisor"]
    master, slave = os.openpty()
    tty.setraw(slave)
    os.set_blocking(master, False)
    dut.rx.value = 1
    await start(dut)
    if params["boots"]:  # the line is heard once the boot image is replayed (hdl.boot)
        while dut.boot.booting.value:
            await ClockCycles(dut.clk, 256)
    cocotb.start_soon(to_host(dut, master, divisor))
    ready = Path(params["ready"])
    ready.write_text(os.ttyname(slave))
    parent = params["parent"]
    idle = 0
    while True:
        try:
            data = os.read(master, 4096)
        except BlockingIOError:
            data = b""
        for byte in data:
            await send_byte(dut, byte, divisor)
        if data:
            idle = 0
            continue
        # Poll the line about every 16 byte times while it is quiet.
        await Timer(16 * 10 * divisor * PERIOD_NS, "ns")
        idle += 1
        if idle % 64 == 0 and not (alive(parent) and ready.exists()):
            break
