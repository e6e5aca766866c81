"""Bench: the MAC lanes against the golden model's ``matvec``."""

import random

import cocotb
import numpy as np

from hdl.matvec import MatVec
from int8model.golden import matvec

from .bench import start
from .runner import bench_params
from .streams import StreamSink, StreamSource


def build(params):
    return MatVec([np.array(w) for w in params["matrices"]], params["lanes"], ways=params.get("ways", 1),
                  lut_ways=params.get("lut_ways", 0), whole=params.get("whole"))


def vectors(unit, rng, count):
    """Edge vectors first (all −128, all 127, alternating), then random ones."""
    out = []
    for i in range(count):
        index = rng.randrange(len(unit.matrices))
        rows = unit.rows[index]
        if i < 3 * len(unit.matrices):
            kind = i // len(unit.matrices)
            x = [[-128] * rows, [127] * rows, [(-128, 127)[e % 2] for e in range(rows)]][kind]
            index = i % len(unit.matrices)
            x = x[:unit.rows[index]] + [0] * (unit.rows[index] - len(x))
        else:
            x = [rng.randint(-128, 127) for _ in range(rows)]
        out.append((index, x))
    return out


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
    words = [-(-unit.cols[index] // ways) if index != unit.whole else 0 for index, _ in work]
    got = await sink.receive(sum(words))
    whole = await whole_task if whole_task else []
    at = whole_at = 0
    for n, ((index, x), count) in enumerate(zip(work, words)):
        want = matvec(np.array(x), unit.matrices[index]).tolist()
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
        assert [o["matrix"] for o in out] == [index] * count, f"{where}: matrix ids"
        assert [o["column"] for o in out] == list(range(0, len(want), ways)), f"{where}: columns"
        assert [o["count"] for o in out] == [min(ways, len(want) - c) for c in range(0, len(want), ways)], \
            f"{where}: counts"
        assert [o["last"] for o in out] == [0] * (count - 1) + [1], f"{where}: last"
        sums = [value for o in out for value in o["acc"][:o["count"]]]
        assert sums == want, f"{where} differs"
