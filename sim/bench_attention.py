"""Bench: the LUT-softmax attention unit (over a KV cache) against the golden model's ``attention``."""

import random

import cocotb
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge
import numpy as np

from int8model.bounds import analyse
from int8model.format import from_json
from int8model.golden import attention, to8

from .bench import start
from .harness import AttentionWithCache
from .runner import bench_params
from .streams import StreamSink, StreamSource


def build(params):
    model = from_json(params["model"])
    return model, AttentionWithCache(model, ways=params.get("ways", 1), rows=params.get("rows", 1))


def rows(rng, bound, count, d, kind):
    if kind == "equal":
        row = [rng.randint(bound.lo, bound.hi) for _ in range(d)]
        return [row[:] for _ in range(count)]
    if kind == "extreme":
        return [[rng.choice((bound.lo, bound.hi)) for _ in range(d)] for _ in range(count)]
    if kind == "negative":
        return [[rng.randint(bound.lo, min(bound.hi, -1)) for _ in range(d)] for _ in range(count)]
    return [[rng.randint(bound.lo, bound.hi) for _ in range(d)] for _ in range(count)]


def cases(model, bounds, rng, count):
    kinds = ["equal", "extreme", "negative", "random"]
    out = []
    for i in range(count):
        # Every seventh, a position of the first group (0, 1, 2, 3 in turn): with one row, any
        # weight gives its V row; from two on, the weights tell.
        pos = min((i // 7) % 4, model.seq_len - 1) if i % 7 == 0 else rng.randrange(model.seq_len)
        kind = kinds[i % len(kinds)] if i < 12 else "random"
        q = rows(rng, bounds["q"], 1, model.d_model, "extreme" if kind == "extreme" else "random")[0]
        keys = rows(rng, bounds["k"], pos + 1, model.d_model, kind)
        values = rows(rng, bounds["v"], pos + 1, model.d_model, "negative" if kind == "negative" else kind)
        out.append((pos, q, keys, values))
    return out


def golden_context(model, q, keys, values):
    """The golden model's ``ci`` for the query ``q`` over the cache rows ``keys``, ``values``."""
    *_, ctx = attention(np.array(q), np.array(keys), np.array(values), model.n_heads,
                        model.requant["M_score"], model.exp_lut)
    return to8(ctx.reshape(-1), model.requant["r_ctx"]).tolist()


@cocotb.test()
async def attention_matches_golden(dut):
    params = bench_params()
    model, unit = build(params)
    bounds = analyse(model)
    rng = random.Random(params["seed"])
    await start(dut)
    writer = StreamSource(dut, "write", unit.write.payload.shape(), dut.clk)
    query = StreamSource(dut, "i", unit.i.payload.shape(), dut.clk)
    sink = StreamSink(dut, "o", unit.o.payload.shape(), dut.clk, stall=params["stall"], rng=rng)
    for n, (pos, q, keys, values) in enumerate(cases(model, bounds, rng, params["count"])):
        # As in the engine: rows 0..pos−1 are cached, row pos is written while the unit
        # already scores, and its readiness is raised only then.
        dut.keys_ready.value = 0
        dut.values_ready.value = 0
        await writer.send([{"pos": j, "k": keys[j], "v": values[j]} for j in range(pos)])
        await query.send([{"q": q, "pos": pos}])
        await ClockCycles(dut.clk, rng.randrange(2 * pos + 12))
        await writer.send([{"pos": pos, "k": keys[pos], "v": values[pos]}])
        dut.keys_ready.value = 1
        await ClockCycles(dut.clk, rng.randrange(8))
        dut.values_ready.value = 1
        ways = unit.attention.ways
        got = await sink.receive(-(-model.d_model // ways))
        want = golden_context(model, q, keys, values)
        assert [v for o in got for v in o["values"][:o["count"]]] == want, f"case {n} (pos {pos}) differs"
        assert [o["count"] for o in got] == [min(ways, model.d_model - c) for c in range(0, model.d_model, ways)]
        assert [o["last"] for o in got] == [0] * (len(got) - 1) + [1]


@cocotb.test()
async def queries_while_context_waits(dut):
    """Each query follows as soon as the unit takes one again (``i.ready``), while the
    context of the one before still waits for a slow consumer: no word of a context may be
    lost or overwritten by the next."""
    params = bench_params()
    model, unit = build(params)
    rng = random.Random(params["seed"])
    await start(dut)
    writer = StreamSource(dut, "write", unit.write.payload.shape(), dut.clk)
    query = StreamSource(dut, "i", unit.i.payload.shape(), dut.clk)
    sink = StreamSink(dut, "o", unit.o.payload.shape(), dut.clk, stall=params["stall"], rng=random.Random(1))
    ways = unit.attention.ways
    words = -(-model.d_model // ways)
    queries = cases(model, analyse(model), rng, params["count"])
    received = cocotb.start_soon(sink.receive(words * len(queries)))
    for pos, q, keys, values in queries:
        while True:
            await ReadOnly()
            if int(dut.i__ready.value):
                break
            await RisingEdge(dut.clk)
        await RisingEdge(dut.clk)
        dut.keys_ready.value = 0
        dut.values_ready.value = 0
        await writer.send([{"pos": j, "k": keys[j], "v": values[j]} for j in range(pos + 1)])
        dut.keys_ready.value = 1
        dut.values_ready.value = 1
        await query.send([{"q": q, "pos": pos}])
    got = await received
    for n, (pos, q, keys, values) in enumerate(queries):
        want = golden_context(model, q, keys, values)
        mine = got[n * words:(n + 1) * words]
        assert [v for o in mine for v in o["values"][:o["count"]]] == want, f"query {n} (pos {pos}) differs"
