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
    return MatVec([np.array(w) for w in params["matrices"]], params["lanes"],
                  banks=params.get("banks", 1), banked=params.get("banked", ()))


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
    rng = random.Random(params["seed"])
    work = vectors(unit, rng, params["count"])
    await start(dut)
    source = StreamSource(dut, "i", unit.i.payload.shape(), dut.clk, idle=params["idle"], rng=rng)
    sinks = [StreamSink(dut, "o" if bank == 0 else f"o{bank}", unit.o.payload.shape(), dut.clk,
                        stall=params["stall"], rng=rng) for bank in range(unit.banks)]
    items = [{"value": v, "matrix": index} for index, x in work for v in x]
    cocotb.start_soon(source.send(items))

    def columns(bank, index):
        """The columns of matrix `index` that bank `bank` computes."""
        if index in unit.banked:
            block = unit.block_cols[index]
            return list(range(bank * block, (bank + 1) * block))
        return list(range(unit.cols[index])) if bank == 0 else []

    # Every bank drains at once: one held back would stall the others.
    receiving = [cocotb.start_soon(sink.receive(sum(len(columns(bank, index)) for index, _ in work)))
                 for bank, sink in enumerate(sinks)]
    for bank, task in enumerate(receiving):
        got = await task
        at = 0
        for n, (index, x) in enumerate(work):
            mine = columns(bank, index)
            want = matvec(np.array(x), unit.matrices[index])[mine].tolist()
            out = got[at:at + len(mine)]
            at += len(mine)
            where = f"vector {n} (matrix {index}), bank {bank}"
            assert [o["matrix"] for o in out] == [index] * len(want), f"{where}: matrix ids"
            assert [o["column"] for o in out] == mine, f"{where}: columns"
            assert [o["last"] for o in out] == [0] * (len(want) - 1) + [1] * bool(want), f"{where}: last"
            assert [o["acc"] for o in out] == want, f"{where} differs"
