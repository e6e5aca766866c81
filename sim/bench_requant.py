"""Bench: the requant unit against the golden model's ``rq`` and ``c8``."""

import random

import cocotb
import numpy as np

from hdl.requant import Requant
from int8model.bounds import Bound
from plan.arithmetic import LoadedRule, Rule
from plan.requant import requant_plan
from int8model.golden import c8, rq

from .bench import start
from .runner import bench_params
from .streams import StreamSink, StreamSource


def rule_bounds(params):
    """The input range of each rule: one for all, or one per rule."""
    bounds = params["in_bound"]
    if isinstance(bounds[0], list):
        return [Bound(*b) for b in bounds]
    return [Bound(*bounds)] * len(params["rules"])


def build(params):
    bounds = params["in_bound"]
    in_bound = rule_bounds(params) if isinstance(bounds[0], list) else Bound(*bounds)
    addends = params.get("addend_bounds")
    followed_by = params.get("followed_by")
    rules = [Rule(*r) for r in params["rules"]]
    loaded = params.get("loaded")  # the multipliers' width: each input brings its rule
    if loaded:
        rules = [LoadedRule(loaded, rule.relu, rule.saturate) for rule in rules]
    return Requant(requant_plan(
        in_bound, rules,
        registered_input=params.get("registered_input", False),
        multiplier_input=params.get("multiplier_input", False),
        sum_stage=params.get("sum_stage", False),
        addend_bounds=None if addends is None else [Bound(*a) if a else None for a in addends],
        followed_by=None if followed_by is None else [Rule(*r) if r else None for r in followed_by]))


def expected(rule, value, addend=0):
    out = rq(value, (rule.multiplier, rule.shift)) + np.int64(addend)
    if rule.relu:
        out = np.maximum(out, 0)
    if rule.saturate:
        out = c8(out)
    return int(out)


@cocotb.test()
async def requant_matches_golden(dut):
    params = bench_params()
    unit = build(params)
    rules = [Rule(*r) for r in params["rules"]]  # the values: a loaded unit's come with each input
    rng = random.Random(params["seed"])
    bounds = rule_bounds(params)
    items = []
    for i in range(params["count"]):
        select = rng.randrange(len(rules))
        lo, hi = bounds[select].lo, bounds[select].hi
        edges = [lo, hi, 0, -1, 1, lo + 1, hi - 1]
        value = edges[i % len(edges)] if i < 4 * len(edges) else rng.randint(lo, hi)
        value = min(max(value, lo), hi)  # a narrow rule's range may not hold 0 or ±1
        item = {"value": value, "tag": 0}
        if len(unit.rules) > 1:
            item["select"] = select
        if unit.plan.multiplier_input:
            item["multiplier"] = rules[select].multiplier
        if unit.plan.loaded:
            item["shift"] = rules[select].shift
        if unit.plan.addend_bounds is not None:
            adds = unit.plan.addend_bounds[select]
            item["addend"] = 0 if adds is None else rng.choice([adds.lo, adds.hi, rng.randint(adds.lo, adds.hi)])
        items.append(item)
    await start(dut)
    source = StreamSource(dut, "i", unit.i.payload.shape(), dut.clk, idle=0.3, rng=rng)
    sink = StreamSink(dut, "o", unit.o.payload.shape(), dut.clk, stall=0.3, rng=rng)
    cocotb.start_soon(source.send(items))
    got = await sink.receive(len(items))
    for item, out in zip(items, got):
        rule = rules[item.get("select", 0)]
        want = expected(rule, item["value"], item.get("addend", 0))
        table = unit.plan.tables[item.get("select", 0)]
        if table is not None:
            want = expected(table.rule, want)
        assert out["value"] == want, (f"{rule} of {item['value']} (adding {item.get('addend', 0)}): "
                                      f"got {out['value']}, want {want}")
