"""Bench: the arg-max head against the golden model's ``argmax``."""

import random

import cocotb
import numpy as np

from hdl.argmax import ArgMax
from int8model.golden import argmax
from plan.units import argmax_plan

from .bench import start
from .runner import bench_params
from .streams import StreamSink, StreamSource


def runs(params, rng):
    lo, hi = -(1 << (params["bits"] - 1)), (1 << (params["bits"] - 1)) - 1
    n = params["length"]
    out = [[lo] * n, [hi] * n, [0] * n, [lo] * (n - 1) + [hi], [hi] + [lo] * (n - 1), [lo, hi, hi][:n]]
    for _ in range(params["count"]):
        length = rng.randint(1, n)
        if rng.random() < 0.5:  # few distinct values: many ties
            pool = [rng.randint(lo, hi) for _ in range(2)]
            out.append([rng.choice(pool) for _ in range(length)])
        else:
            out.append([rng.randint(lo, hi) for _ in range(length)])
    return out


@cocotb.test()
async def argmax_matches_golden(dut):
    params = bench_params()
    unit = ArgMax(argmax_plan(params["bits"], params["length"], params.get("ways", 1)))
    ways = unit.ways
    rng = random.Random(params["seed"])
    await start(dut)
    source = StreamSource(dut, "i", unit.i.payload.shape(), dut.clk, idle=0.3, rng=rng)
    sink = StreamSink(dut, "o", unit.o.payload.shape(), dut.clk, stall=0.3, rng=rng)
    work = runs(params, rng)
    # Words of `ways` values; the places past a run's end hold noise, which must not count.
    hi = (1 << (params["bits"] - 1)) - 1
    items = []
    for r in work:
        for at in range(0, len(r), ways):
            word = r[at:at + ways]
            items.append({"values": word + [rng.choice([hi, 0]) for _ in range(ways - len(word))],
                          "count": len(word), "last": int(at + ways >= len(r))})
    cocotb.start_soon(source.send(items))
    got = await sink.receive(len(work))
    for r, index in zip(work, got):
        assert index == argmax(np.array(r)), f"{r}: got {index}"
