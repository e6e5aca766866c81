"""Bench: the requant unit against the golden model's ``rq`` and ``c8``."""

import random

import cocotb
import numpy as np

from hdl.requant import Requant, Rule
from int8model.bounds import Bound
from int8model.golden import c8, rq

from .bench import start
from .runner import bench_params
from .streams import StreamSink, StreamSource


def build(params):
    return Requant(Bound(*params["in_bound"]), [Rule(*r) for r in params["rules"]],
                   registered_input=params.get("registered_input", False))


def expected(rule, value):
    out = rq(value, (rule.multiplier, rule.shift))
    if rule.relu:
        out = np.maximum(out, 0)
    if rule.saturate:
        out = c8(out)
    return int(out)


@cocotb.test()
async def requant_matches_golden(dut):
    params = bench_params()
    unit = build(params)
    rng = random.Random(params["seed"])
    lo, hi = params["in_bound"]
    edges = [lo, hi, 0, -1, 1, lo + 1, hi - 1]
    items = []
    for i in range(params["count"]):
        value = edges[i % len(edges)] if i < 4 * len(edges) else rng.randint(lo, hi)
        item = {"value": value, "tag": 0}
        if len(unit.rules) > 1:
            item["select"] = rng.randrange(len(unit.rules))
        items.append(item)
    await start(dut)
    source = StreamSource(dut, "i", unit.i.payload.shape(), dut.clk, idle=0.3, rng=rng)
    sink = StreamSink(dut, "o", unit.o.payload.shape(), dut.clk, stall=0.3, rng=rng)
    cocotb.start_soon(source.send(items))
    got = await sink.receive(len(items))
    for item, out in zip(items, got):
        rule = unit.rules[item.get("select", 0)]
        want = expected(rule, item["value"])
        assert out["value"] == want, f"{rule} of {item['value']}: got {out['value']}, want {want}"
