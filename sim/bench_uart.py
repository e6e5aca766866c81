"""Bench: the UART against a bit-level 8N1 line model, both directions."""

import random

import cocotb
from cocotb.triggers import FallingEdge, Timer

from hdl.uart import UART

from .bench import start
from .runner import bench_params
from .streams import StreamSink, StreamSource

PERIOD_NS = 10


async def drive_line(dut, frames, divisor):
    """Put frames on ``rx``: (byte, stop bit level) pairs, with random idle gaps."""
    bit = divisor * PERIOD_NS
    for byte, stop in frames:
        for level in [0] + [(byte >> i) & 1 for i in range(8)] + [stop]:
            dut.rx.value = level
            await Timer(bit, "ns")
        dut.rx.value = 1
        await Timer(bit * random.randint(1, 3), "ns")


async def read_line(dut, count, divisor):
    bit = divisor * PERIOD_NS
    out = []
    while len(out) < count:
        await FallingEdge(dut.tx)
        await Timer(bit + bit // 2, "ns")
        byte = 0
        for i in range(8):
            byte |= int(dut.tx.value) << i
            await Timer(bit, "ns")
        assert int(dut.tx.value) == 1, "stop bit"
        out.append(byte)
    return out


@cocotb.test()
async def transmits_bytes(dut):
    params = bench_params()
    rng = random.Random(params["seed"])
    unit = UART(params["divisor"])
    dut.rx.value = 1
    await start(dut)
    data = [0x00, 0xFF, 0x55, 0xAA] + [rng.randrange(256) for _ in range(60)]
    source = StreamSource(dut, "i", unit.i.payload.shape(), dut.clk, idle=0.5, rng=rng)
    cocotb.start_soon(source.send(data))
    assert await read_line(dut, len(data), params["divisor"]) == data


@cocotb.test()
async def receives_bytes_and_drops_framing_errors(dut):
    params = bench_params()
    rng = random.Random(params["seed"] + 1)
    unit = UART(params["divisor"])
    dut.rx.value = 1
    await start(dut)
    frames = [(rng.randrange(256), 0 if i % 9 == 4 else 1) for i in range(60)]
    good = [byte for byte, stop in frames if stop]
    sink = StreamSink(dut, "o", unit.o.payload.shape(), dut.clk)
    cocotb.start_soon(drive_line(dut, frames, params["divisor"]))
    assert await sink.receive(len(good), timeout=200_000) == good
    assert int(dut.errors.value) == len(frames) - len(good)
