"""Bench: the MAC lanes against the golden model's ``matvec``."""

import random

import cocotb
import numpy as np

from hdl.matvec import MatVec
from hdl.matvec_hidden import HiddenMatVec
from int8model.bounds import Bound
from int8model.golden import matvec
from plan.arithmetic import Rule
from plan.lanes import lanes_plan, weight_table

from .bench import start
from .runner import bench_params
from .streams import StreamSink, StreamSource


def hidden_of(params):
    """``hidden`` from the parameters: ``[first, second, rules ([M, S, relu, saturate] each), [lo, hi]]``."""
    if params.get("hidden") is None:
        return None
    first, second, rules, (lo, hi) = params["hidden"]
    return first, second, [Rule(*rule) for rule in rules], Bound(lo, hi)


def build(params):
    """The unit the parameters ask for, and its matrices."""
    matrices = [np.array(w) for w in params["matrices"]]
    plan = lanes_plan(matrices, params["lanes"], ways=params.get("ways", 1), lut_ways=params.get("lut_ways", 0),
                      order=params.get("order"), whole=params.get("whole"), hidden=hidden_of(params))
    lanes = MatVec if plan.hidden is None else HiddenMatVec
    return lanes(plan, weight_table(plan, matrices)), matrices


def vectors(plan, rng, count):
    """Edge vectors first (all −128, all 127, alternating), then random ones; none for the
    second of ``hidden`` (its vector is the first's sums)."""
    indices = [index for index in range(len(plan.matrices)) if plan.hidden is None or index != plan.hidden.second]
    out = []
    for i in range(count):
        index = rng.choice(indices)
        rows = plan.rows[index]
        if i < 3 * len(indices):
            kind = i // len(indices)
            index = indices[i % len(indices)]
            rows = plan.rows[index]
            x = [[-128] * rows, [127] * rows, [(-128, 127)[e % 2] for e in range(rows)]][kind]
        else:
            x = [rng.randint(-128, 127) for _ in range(rows)]
        out.append((index, x))
    return out


def expected(plan, matrices, index, x):
    """The sums a vector for matrix ``index`` makes, and the matrix they leave as: with
    ``hidden``, the first's vector makes the second's sums of the first's, through the rules."""
    sums = matvec(np.array(x), matrices[index])
    if plan.hidden is None or index != plan.hidden.first:
        return index, sums.tolist()
    for rule in plan.hidden.rules:
        sums = np.array([rule.apply(value) for value in sums])
    return plan.hidden.second, matvec(sums, matrices[plan.hidden.second]).tolist()


@cocotb.test()
async def matvec_matches_golden(dut):
    params = bench_params()
    unit, matrices = build(params)
    plan = unit.plan
    ways = plan.ways
    rng = random.Random(params["seed"])
    work = vectors(plan, rng, params["count"])
    await start(dut)
    source = StreamSource(dut, "i", unit.i.payload.shape(), dut.clk, idle=params["idle"], rng=rng)
    sink = StreamSink(dut, "o", unit.o.payload.shape(), dut.clk, stall=params["stall"], rng=rng)
    # Words of `ways` elements; the empty places of a last word hold noise, which must not count.
    items = []
    for index, x in work:
        for at in range(0, len(x), ways):
            word = x[at:at + ways]
            items.append({"values": word + [rng.randint(-128, 127) for _ in range(ways - len(word))],
                          "matrix": index})
    cocotb.start_soon(source.send(items))
    # The `whole` matrix's sums leave on `w`, a group a word, the others' on `o`.
    whole_sink = whole_task = None
    if plan.whole is not None:
        whole_sink = StreamSink(dut, "w", unit.w.payload.shape(), dut.clk, stall=params["stall"], rng=rng)
        groups = sum(plan.groups[index] for index, _ in work if index == plan.whole)
        whole_task = cocotb.start_soon(whole_sink.receive(groups))
    words = [-(-plan.cols[expected(plan, matrices, index, x)[0]] // ways) if index != plan.whole else 0
             for index, x in work]
    got = await sink.receive(sum(words))
    whole = await whole_task if whole_task else []
    at = whole_at = 0
    for n, ((index, x), count) in enumerate(zip(work, words)):
        leaves, want = expected(plan, matrices, index, x)
        where = f"vector {n} (matrix {index})"
        if index == plan.whole:
            groups = whole[whole_at:whole_at + plan.groups[index]]
            whole_at += plan.groups[index]
            lanes = plan.lanes
            assert [g["count"] for g in groups] == [min(lanes, len(want) - c) for c in range(0, len(want), lanes)], \
                f"{where}: counts"
            assert [g["last"] for g in groups] == [0] * (len(groups) - 1) + [1], f"{where}: last"
            assert [value for g in groups for value in g["values"][:g["count"]]] == want, f"{where} differs"
            continue
        out = got[at:at + count]
        at += count
        assert [o["matrix"] for o in out] == [leaves] * count, f"{where}: matrix ids"
        assert [o["column"] for o in out] == list(range(0, len(want), ways)), f"{where}: columns"
        assert [o["count"] for o in out] == [min(ways, len(want) - c) for c in range(0, len(want), ways)], \
            f"{where}: counts"
        assert [o["last"] for o in out] == [0] * (count - 1) + [1], f"{where}: last"
        sums = [value for o in out for value in o["acc"][:o["count"]]]
        assert sums == want, f"{where} differs"
