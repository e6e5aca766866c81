import numpy as np
import pytest

from int8model import analyse, load
from int8model.format import from_json
from int8model.synthetic import random_model
from plan.attention import AttentionPlan, attention_plan, exp_entries
from sim.harness import AttentionWithCache
from sim.runner import ECP5Cells, generated_verilog, run_bench

SHIPPED = load("models/zen32.json")


def run(name, model, seed, count=60, stall=0.3, ways=1, rows=1, platform=None, testcase="attention_matches_golden"):
    params = {"model": model.to_json(), "seed": seed, "count": count, "stall": stall, "ways": ways, "rows": rows}
    run_bench(AttentionWithCache(model, ways=ways, rows=rows), name=name,
              test_module="sim.bench_attention", params=params, platform=platform, testcase=testcase)


@pytest.mark.parametrize("shape", [(8, 1, 8, 8, 8), (16, 4, 16, 16, 12), (32, 4, 32, 32, 32), (24, 3, 8, 8, 5)])
def test_random_models(shape):
    rng = np.random.default_rng(sum(shape))
    run("attention_{}_{}_{}_{}_{}".format(*shape), random_model(rng, *shape), seed=sum(shape))


@pytest.mark.parametrize("shape, rows", [((8, 1, 8, 8, 8), 2), ((32, 4, 32, 32, 32), 2), ((24, 3, 8, 8, 5), 2),
                                         ((16, 4, 16, 16, 12), 4), ((64, 4, 16, 16, 9), 2)])
def test_rows_a_cycle(shape, rows):
    """Groups of rows from a banked cache, the last group part past pos; the widest (128
    multipliers) with its head sums in three stages."""
    rng = np.random.default_rng(sum(shape) + 10 * rows)
    run("attention_rows{}_{}_{}_{}_{}_{}".format(rows, *shape), random_model(rng, *shape), seed=rows,
        rows=rows, ways=2)


@pytest.mark.parametrize("shape, ways", [((32, 4, 32, 32, 32), 3), ((24, 3, 8, 8, 5), 2), ((8, 2, 8, 8, 8), 3)])
def test_several_columns_a_cycle(shape, ways):
    """Context words of `ways` columns, spanning heads, the last one part empty."""
    rng = np.random.default_rng(sum(shape) + ways)
    run("attention_ways{}_{}_{}_{}_{}_{}".format(ways, *shape), random_model(rng, *shape), seed=ways, ways=ways)


def test_ecp5_multipliers_in_their_own_registers():
    """Elaborated as for an ECP5: the first bank's multipliers (q·K, then weight·V) hold their
    operands in the MULT18X18Ds' own input registers, and so do the M_score products (the
    clamped gap) of every head and bank, as many as the plan counts; simulated with the
    primitives' models, against the golden model."""
    rng = np.random.default_rng(41)
    model = random_model(rng, 16, 2, 16, 16, 12)
    plan = attention_plan(model, analyse(model), ways=2, rows=2)
    assert plan.gap_stages == 1
    run("attention_ecp5", model, seed=41, rows=2, ways=2, platform=ECP5Cells())
    multipliers = generated_verilog("attention_ecp5").count("MULT18X18D #(")
    assert multipliers == plan.multipliers == 16 + 2 * 2  # d_model, heads × banks


@pytest.mark.parametrize("r_ctx", [(1, 0), (4, 2)])
def test_context_left_as_it_is(r_ctx):
    """An r_ctx that changes no context (a trained model's (1, 0)): the quotients leave the
    dividers as they are, with no requant after them."""
    rng = np.random.default_rng(60 + r_ctx[0])
    doc = random_model(rng, 16, 4, 16, 16, 12).to_json()
    doc["requant"]["r_ctx"] = list(r_ctx)
    model = from_json(doc)
    assert not attention_plan(model, analyse(model)).ctx_requant
    run(f"attention_ctx_{r_ctx[0]}_{r_ctx[1]}", model, seed=r_ctx[0], rows=2, ways=3)


@pytest.mark.parametrize("ways", [1, 4])
def test_queries_while_context_waits(ways):
    """A query as soon as the unit takes one, while a slow consumer holds the context before:
    the dividers never stall, so the next context must wait for room behind them."""
    rng = np.random.default_rng(50 + ways)
    run(f"attention_back_to_back{ways}", random_model(rng, 16, 4, 16, 16, 12), seed=ways, count=12, stall=0.9,
        ways=ways, rows=2, testcase="queries_while_context_waits")


def test_extreme_models():
    rng = np.random.default_rng(99)
    run("attention_extreme", random_model(rng, 16, 2, 16, 16, 16, extreme=True), seed=99)


def test_lut_index_beyond_table():
    doc = random_model(np.random.default_rng(4), 16, 4, 16, 16, 16).to_json()
    doc["exp_lut"] = [1000, 300, 7]
    doc["requant"]["M_score"] = [3, 1]
    run("attention_short_lut", from_json(doc), seed=4)


def test_single_entry_lut_and_negative_score_scale():
    doc = random_model(np.random.default_rng(6), 8, 2, 8, 8, 8).to_json()
    doc["exp_lut"] = [5]
    doc["requant"]["M_score"] = [-77, 3]
    run("attention_one_entry", from_json(doc), seed=6, count=20)


def test_an_extreme_score_scale_reads_the_table_as_it_stands():
    """A gap scale spreading the table past SPREAD_ENTRIES reads it behind a clamp instead (a
    random extreme model's had spread one entry over 1,687,728); a trained model's is spread."""
    doc = random_model(np.random.default_rng(8), 16, 4, 16, 16, 16).to_json()
    doc["exp_lut"] = [1000, 300, 7]
    doc["requant"]["M_score"] = [1687727, 0]
    model = from_json(doc)
    plan = attention_plan(model, analyse(model))
    assert not plan.exp_spread and exp_entries(plan, model.exp_lut) == doc["exp_lut"]
    run("attention_unspread_lut", model, seed=8)
    shipped = attention_plan(SHIPPED, analyse(SHIPPED))
    spread = exp_entries(shipped, SHIPPED.exp_lut)
    assert shipped.exp_spread and len(SHIPPED.exp_lut) < len(spread) == shipped.exp_depth <= AttentionPlan.SPREAD_ENTRIES


@pytest.mark.parametrize("multiplier, shift, nlut, most", [
    (29608, 21, 128, 261120), (1, 0, 16, 40), (3, 2, 8, 5), (7, 0, 1, 100), (-5, 3, 64, 1000), (0, 0, 9, 50),
    (2**40 - 1, 63, 256, 2**20),
])
def test_gaps_saturate_where_the_index_stops_changing(multiplier, shift, nlut, most):
    """Clamping the gap there (or higher) reads the same exp entry for every gap, and no lower
    clamp would."""
    from int8model.golden import rq
    from plan.arithmetic import Rule, saturating_gap

    def index(gap):
        return min(max(int(rq(np.int64(gap), (multiplier, shift))), 0), nlut - 1)
    limit = saturating_gap(Rule.rq((multiplier, shift)), nlut, most)
    gaps = sorted({*range(0, min(most, 5000) + 1), *np.linspace(0, most, 2000, dtype=np.int64).tolist()})
    assert all(index(min(g, limit)) == index(g) for g in gaps)
    if 0 < limit < most:
        assert index(limit - 1) != index(most)
    # The hardware clamps at the next all-ones value (judged on the high bits): the same.
    ones = (1 << max(1, limit.bit_length())) - 1
    assert ones >= limit and all(index(min(g, ones)) == index(g) for g in gaps)


RANDOM = random_model(np.random.default_rng(1), 32, 4, 32, 32, 32)
WIDE = random_model(np.random.default_rng(2), 64, 4, 16, 16, 8)
LONG = random_model(np.random.default_rng(3), 16, 4, 16, 16, 80)


@pytest.mark.parametrize("shape, rows", [((16, 4, 16, 16, 80), 1), ((16, 2, 16, 16, 128), 2)])
def test_scores_in_block_ram(shape, rows):
    """More groups of rows than LUT RAM takes (80 at a row a cycle; 64 at two, as the deep
    demo's): the scores in block RAM, their read held a cycle before the gap."""
    model = random_model(np.random.default_rng(sum(shape) + rows), *shape)
    assert attention_plan(model, analyse(model), rows=rows).score_read_stages == 1
    run("attention_block_scores{}_{}_{}_{}_{}_{}".format(rows, *shape), model, seed=rows, rows=rows, ways=2)


def test_scores_read_as_they_are_from_lut_ram():
    assert attention_plan(SHIPPED, analyse(SHIPPED), ways=4, rows=2).score_read_stages == 0
    assert attention_plan(LONG, analyse(LONG), rows=2).score_read_stages == 1


def test_head_sums_in_three_stages_where_attention_spreads():
    """A head's pair sums are summed four by four first from 128 multipliers on (the deep
    demo's 64 columns × 2 rows), not in the shipped build's (32 × 2); there the dens' enable
    and select are registered too (``test_rows_a_cycle`` holds that build against the golden
    model, ``test_latency[wide-*]`` its cycles)."""
    for model, ways, rows, spread in [(SHIPPED, 4, 2, False), (WIDE, 2, 1, False), (WIDE, 2, 2, True)]:
        plan = attention_plan(model, analyse(model), ways=ways, rows=rows)
        assert (plan.spread, plan.sum_stages) == (spread, 3 if spread else 2)


@pytest.mark.parametrize("rows, pos", [(2, 0), (2, 1), (2, 6), (1, 3)])
@pytest.mark.parametrize("model", [SHIPPED, RANDOM, WIDE, LONG], ids=["shipped", "random", "wide", "long"])
def test_latency(model, rows, pos):
    """From taking the query to the first word of the context, with rows 0..pos cached and
    ready: ``2·ceil((pos + 1) / rows) + 16 + sum_stages`` cycles, more for pos < rows (as
    the unit's docstring states), whether r_ctx changes the context (the random models') or
    not (the shipped model's (1, 0)): the dividers' last stage applies it. The wide model's
    head sums take three stages at 2 rows; the long model's scores, in block RAM, are read
    through a register of their own at no cycle more, but where group 0 is the only one."""
    from sim.latency import outputs_after

    unit = AttentionWithCache(model, ways=4, rows=rows)
    assert unit.plan.ctx_requant == (model is not SHIPPED)
    rng = np.random.default_rng(pos)

    async def offer(ctx):
        for j in range(pos + 1):
            ctx.set(unit.write.payload.pos, j)
            ctx.set(unit.write.payload.k, rng.integers(-128, 128, model.d_model).tolist())
            ctx.set(unit.write.payload.v, rng.integers(-128, 128, model.d_model).tolist())
            ctx.set(unit.write.valid, 1)
            await ctx.tick()
        ctx.set(unit.write.valid, 0)
        ctx.set(unit.keys_ready, 1)
        ctx.set(unit.values_ready, 1)
        await ctx.tick()
        ctx.set(unit.i.payload.q, rng.integers(-128, 128, model.d_model).tolist())
        ctx.set(unit.i.payload.pos, pos)
        ctx.set(unit.i.valid, 1)
        await ctx.tick().until(unit.i.ready)
        ctx.set(unit.i.valid, 0)

    seen = outputs_after(unit, offer, None, 60)
    more = (1 + unit.plan.score_read_stages) if pos < rows else 0
    assert seen[:1] == [2 * -(-(pos + 1) // rows) + 16 + unit.plan.sum_stages + more]
