"""Bench: the floor divider against the golden model's ``fdiv`` (and, with a rule, its ``to8``
of the quotient)."""

import random

import cocotb

from hdl.divider import FloorDivider
from int8model.bounds import Bound
from plan.arithmetic import Rule
from plan.requant import divider_plan
from int8model.golden import fdiv, to8

from .bench import start
from .runner import bench_params
from .streams import StreamSink, StreamSource


def rule_of(params):
    return Rule.to8(params["rule"]) if params.get("rule") else None


def build(params):
    return FloorDivider(divider_plan(Bound(*params["num"]), Bound(*params["den"]), Bound(*params["quotient"]),
                                     bits_per_stage=params.get("bits_per_stage", 2), rule=rule_of(params)))


def cases(params, rng):
    """Numerators and denominators whose quotient lies in the declared range, edges first."""
    qlo, qhi = params["quotient"]
    dlo, dhi = params["den"]
    out = []
    for den in (dlo, dhi, dlo + 1, dhi - 1):
        for num in (qlo * den, qhi * den + den - 1, 0, -1, qlo * den + 1, -den, -den - 1, den):
            out.append((num, den))
    while len(out) < params["count"]:
        den = rng.randint(dlo, dhi)
        out.append((rng.randint(qlo * den, qhi * den + den - 1), den))
    return [(n, d) for n, d in out if qlo <= n // d <= qhi]


@cocotb.test()
async def divider_matches_golden(dut):
    params = bench_params()
    unit = build(params)
    rng = random.Random(params["seed"])
    work = cases(params, rng)
    await start(dut)
    source = StreamSource(dut, "i", unit.i.payload.shape(), dut.clk, idle=0.3, rng=rng)
    sink = StreamSink(dut, "o", unit.o.payload.shape(), dut.clk, stall=0.3, rng=rng)
    cocotb.start_soon(source.send([{"num": n, "den": d, "tag": 0} for n, d in work]))
    got = await sink.receive(len(work))
    rule = rule_of(params)
    for (num, den), out in zip(work, got):
        # The rule as the golden model applies r_ctx: to8(q) = c8((q · M) >> S).
        want = int(fdiv(num, den)) if rule is None else int(to8(fdiv(num, den), params["rule"]))
        assert out["value"] == want, f"{num} // {den}{' then ' + str(rule) if rule else ''}: got {out['value']}"
