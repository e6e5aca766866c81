"""Bench: the KV cache returns, for every position, the row last written there."""

import random

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from hdl.kv_cache import KVCache
from plan.units import CachePlan

from .bench import start
from .payload import unpack
from .runner import bench_params
from .streams import StreamSource


@cocotb.test()
async def cache_reads_back_rows(dut):
    params = bench_params()
    unit = KVCache(CachePlan(params["d_model"], params["seq_len"], params.get("banks", 1)))
    rng = random.Random(params["seed"])
    rows_shape = unit.read.k.shape()
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
        # A read a cycle, each position's rows checked exactly LATENCY cycles after its group
        # is offered (the attention unit counts on that timing, not just on the rows arriving).
        order = rng.sample(sorted(shadow), len(shadow))
        for cycle in range(len(order) + KVCache.LATENCY - 1):
            if cycle < len(order):
                dut.read__group.value = order[cycle] // unit.banks
            await RisingEdge(dut.clk)
            await ReadOnly()
            back = cycle - (KVCache.LATENCY - 1)
            if back >= 0:
                pos = order[back]
                bank = pos % unit.banks
                got = (unpack(rows_shape, int(dut.read__k.value))[bank],
                       unpack(rows_shape, int(dut.read__v.value))[bank])
                assert got == shadow[pos], f"round {round_}, position {pos}"
            await FallingEdge(dut.clk)
