"""Bench: the MAC lanes against the golden model's ``matvec``."""

import random

import cocotb
import numpy as np

from hdl.matvec import MatVec
from hdl.requant import Rule
from int8model.bounds import Bound
from int8model.golden import matvec

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
    return MatVec([np.array(w) for w in params["matrices"]], params["lanes"], ways=params.get("ways", 1),
                  lut_ways=params.get("lut_ways", 0), whole=params.get("whole"), hidden=hidden_of(params))


def vectors(unit, rng, count):
    """Edge vectors first (all −128, all 127, alternating), then random ones; none for the
    second of ``hidden`` (its vector is the first's sums)."""
    indices = [index for index in range(len(unit.matrices)) if unit.hidden is None or index != unit.hidden[1]]
    out = []
    for i in range(count):
        index = rng.choice(indices)
        rows = unit.rows[index]
        if i < 3 * len(indices):
            kind = i // len(indices)
            index = indices[i % len(indices)]
            rows = unit.rows[index]
            x = [[-128] * rows, [127] * rows, [(-128, 127)[e % 2] for e in range(rows)]][kind]
        else:
            x = [rng.randint(-128, 127) for _ in range(rows)]
        out.append((index, x))
    return out


def expected(unit, index, x):
    """The sums a vector for matrix ``index`` makes, and the matrix they leave as: with
    ``hidden``, the first's vector makes the second's sums of the first's, through the rules."""
    sums = matvec(np.array(x), unit.matrices[index])
    if unit.hidden is None or index != unit.hidden[0]:
        return index, sums.tolist()
    first, second, rules, _ = unit.hidden
    for rule in rules:
        sums = np.array([rule.apply(value) for value in sums])
    return second, matvec(sums, unit.matrices[second]).tolist()


@cocotb.test()
async def matvec_matches_golden(dut):
    params = bench_params()
    unit = build(params)
    ways = unit.ways
    rng = random.Random(params["seed"])
    work = vectors(unit, rng, params["count"])
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
    if unit.whole is not None:
        whole_sink = StreamSink(dut, "w", unit.w.payload.shape(), dut.clk, stall=params["stall"], rng=rng)
        groups = sum(unit.groups[index] for index, _ in work if index == unit.whole)
        whole_task = cocotb.start_soon(whole_sink.receive(groups))
    words = [-(-unit.cols[expected(unit, index, x)[0]] // ways) if index != unit.whole else 0 for index, x in work]
    got = await sink.receive(sum(words))
    whole = await whole_task if whole_task else []
    at = whole_at = 0
    for n, ((index, x), count) in enumerate(zip(work, words)):
        leaves, want = expected(unit, index, x)
        where = f"vector {n} (matrix {index})"
        if index == unit.whole:
            groups = whole[whole_at:whole_at + unit.groups[index]]
            whole_at += unit.groups[index]
            lanes = unit.lanes
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
