"""Bench: the KV cache returns, for every position, the row last written there."""

import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from hdl.kv_cache import KVCache

from .bench import start
from .payload import unpack
from .runner import bench_params
from .streams import StreamSource


@cocotb.test()
async def cache_reads_back_rows(dut):
    params = bench_params()
    unit = KVCache(params["d_model"], params["seq_len"])
    rng = random.Random(params["seed"])
    row_shape = unit.read.k.shape()
    await start(dut)
    writer = StreamSource(dut, "write", unit.write.payload.shape(), dut.clk)
    shadow = {}
    for round_ in range(params["rounds"]):
        writes = []
        for pos in rng.sample(range(unit.seq_len), rng.randint(1, unit.seq_len)):
            k = [rng.randint(-128, 127) for _ in range(unit.d_model)]
            v = [rng.choice((-128, 127, rng.randint(-128, 127))) for _ in range(unit.d_model)]
            writes.append({"pos": pos, "k": k, "v": v})
            shadow[pos] = (k, v)
        await writer.send(writes)
        for pos in rng.sample(sorted(shadow), len(shadow)):
            dut.read__row.value = pos
            await RisingEdge(dut.clk)  # one cycle of latency
            await ReadOnly()
            got = (unpack(row_shape, int(dut.read__k.value)), unpack(row_shape, int(dut.read__v.value)))
            assert got == shadow[pos], f"round {round_}, position {pos}"
            await RisingEdge(dut.clk)
