import numpy as np
import pytest

from hdl.matvec import MatVec
from hdl.matvec_hidden import HiddenMatVec
from int8model.bounds import matvec_bound
from int8model.synthetic import random_model
from plan.arithmetic import Rule
from plan.lanes import INT8, lanes_plan, weight_table
from plan.schedule import hidden_rules
from sim.bench_matvec import build
from sim.runner import ECP5Cells, generated_verilog, run_bench


def run(name, matrices, lanes, seed, count=60, idle=0.3, stall=0.3, ways=1, lut_ways=0, platform=None, whole=None,
        hidden=None):
    params = {"matrices": [np.asarray(w).tolist() for w in matrices], "lanes": lanes, "ways": ways,
              "lut_ways": lut_ways, "seed": seed, "count": count, "idle": idle, "stall": stall, "whole": whole,
              "hidden": hidden}
    unit, _ = build(params)
    run_bench(unit, name=name, test_module="sim.bench_matvec", params=params, platform=platform)


def lanes(matrices, count, **options):
    """The MAC lanes over ``matrices``: their plan's variant, the matrices in its weight memory."""
    plan = lanes_plan(matrices, count, **options)
    return (MatVec if plan.hidden is None else HiddenMatVec)(plan, weight_table(plan, matrices))


def hidden_param(first, second, rules, matrix):
    """``hidden`` for the bench: the first matrix's index and its int8 inputs' sums' bound."""
    bound = matvec_bound(INT8, np.asarray(matrix))
    return [first, second, [[r.multiplier, r.shift, r.relu, r.saturate] for r in rules], [bound.lo, bound.hi]]


def test_accumulator_width_follows_the_weights():
    w = np.full((4, 3), -128)
    plan = lanes_plan([w], 2)
    assert plan.acc_bound.hi == 4 * 128 * 128 and plan.acc_bound.lo == 4 * 127 * -128
    assert plan.acc_bits == 18
    assert plan.groups == [2] and plan.depth == 8


def test_extreme_weights_and_odd_shapes():
    rng = np.random.default_rng(0)
    matrices = [np.full((5, 7), -128), np.full((3, 2), 127), rng.integers(-128, 128, (1, 9)),
                rng.integers(-128, 128, (9, 1)), rng.choice([-128, 127], (6, 6))]
    run("matvec_edges", matrices, lanes=4, seed=0)


@pytest.mark.parametrize("lanes", [1, 8, 32])
def test_model_matrices(lanes):
    rng = np.random.default_rng(lanes)
    model = random_model(rng, 32, 4, 48, 20, 8)
    w = model.weights
    matrices = [np.concatenate([w["Wq"], w["Wk"], w["Wv"]], axis=1), w["Wo"], w["W1"], w["W2"], w["Eq"].T]
    run(f"matvec_lanes{lanes}", matrices, lanes=lanes, seed=lanes, count=40 if lanes > 1 else 12)


@pytest.mark.parametrize("ways,lanes", [(2, 4), (3, 6), (3, 33), (4, 8)])
def test_several_elements_a_cycle(ways, lanes):
    """Words of `ways` elements in and out; rows and columns that are not multiples of it."""
    rng = np.random.default_rng(10 * ways + lanes)
    model = random_model(rng, 32, 4, 20, 7, 8)
    w = model.weights
    matrices = [np.concatenate([w["Wq"], w["Wk"], w["Wv"]], axis=1), w["Wo"], w["W1"], w["W2"], w["Eq"].T,
                np.full((5, 7), -128), rng.integers(-128, 128, (1, 9))]
    run(f"matvec_ways{ways}_{lanes}", matrices, lanes=lanes, ways=ways, seed=ways, count=30)


@pytest.mark.parametrize("ways, lanes, stall", [(4, 32, 0.3), (2, 6, 0.3), (4, 8, 0)])
def test_a_whole_group_at_once(ways, lanes, stall):
    """One matrix's sums leave a group at a time on `w` (the head's, for the arg-max), between
    vectors of the others on `o`: with more columns than lanes, and a last group part empty."""
    rng = np.random.default_rng(100 + lanes)
    model = random_model(rng, 32, 4, 20, 29, 8)
    w = model.weights
    matrices = [w["Wo"], w["W1"], w["W2"], w["Eq"].T]
    run(f"matvec_whole{ways}_{lanes}", matrices, lanes=lanes, ways=ways, seed=lanes, count=24, stall=stall,
        idle=stall, whole=3)


def test_lanes_must_be_a_multiple_of_the_ways():
    with pytest.raises(ValueError, match="multiple of the ways"):
        lanes_plan([np.zeros((2, 7), dtype=int)], 4, ways=3)


def test_full_speed_without_stalls():
    rng = np.random.default_rng(5)
    run("matvec_full_speed", [rng.integers(-128, 128, (16, 40))], lanes=16, seed=5, idle=0, stall=0)
    run("matvec_full_speed_ways", [rng.integers(-128, 128, (16, 40))], lanes=16, ways=2, seed=6,
        idle=0, stall=0)


@pytest.mark.parametrize("ways,lut_ways,lanes", [(1, 1, 4), (3, 1, 6), (4, 2, 8)])
def test_lut_multipliers(ways, lut_ways, lanes):
    """Lanes whose last ways multiply in LUT logic: extreme weights, odd shapes."""
    rng = np.random.default_rng(100 + 10 * ways + lut_ways)
    matrices = [np.full((5, 7), -128), np.full((7, 3), 127), rng.choice([-128, -1, 0, 127], (9, 10)),
                rng.integers(-128, 128, (13, lanes + 1))]
    run(f"matvec_lut{lut_ways}of{ways}_{lanes}", matrices, lanes=lanes, ways=ways, lut_ways=lut_ways,
        seed=lut_ways, count=30)


def test_ecp5_multipliers_in_their_own_registers():
    """Elaborated as for an ECP5: each DSP way is a MULT18X18D whose own input registers hold
    its operands, and the pipeline's enables go through global buffers; simulated with the
    primitives' models, the sums are the golden ones, stalls and all."""
    rng = np.random.default_rng(7)
    matrices = [np.full((5, 7), -128), np.full((7, 3), 127), rng.choice([-128, -1, 0, 127], (9, 10)),
                rng.integers(-128, 128, (13, 9))]
    run("matvec_ecp5", matrices, lanes=8, ways=4, lut_ways=1, seed=7, count=30, platform=ECP5Cells())
    verilog = generated_verilog("matvec_ecp5")
    assert verilog.count("MULT18X18D #(") == 8 * 3


def test_lut_ways_take_at_most_the_ways():
    with pytest.raises(ValueError, match="0 to 2"):
        lanes_plan([np.zeros((2, 2))], 2, ways=2, lut_ways=3)


def test_vectors_out_of_order_wait_a_cycle():
    """The weight address is set to the matrix expected next, before its vector comes: a vector
    in `order` is taken at once, any other a cycle later; the sums are right either way."""
    from amaranth.sim import Simulator
    from int8model.golden import matvec

    rng = np.random.default_rng(7)
    matrices = [rng.integers(-128, 128, (3, 4)), rng.integers(-128, 128, (5, 2)), rng.integers(-128, 128, (2, 6))]
    unit = lanes(matrices, 2, order=[1, 2])
    sequence = [1, 2, 1, 0, 0, 2, 1, 2]  # after 1 comes 2; after 2, 1; after 0, 1
    expected_waits = [0, 0, 0, 1, 1, 1, 0, 0]
    vectors = [rng.integers(-128, 128, matrices[index].shape[0]).tolist() for index in sequence]
    waits, sums = [], []

    async def send(ctx):
        for index, x in zip(sequence, vectors):
            ctx.set(unit.i.payload.matrix, index)
            ctx.set(unit.i.valid, 1)
            for n, value in enumerate(x):
                ctx.set(unit.i.payload.values[0], value)
                cycles = 0
                while not ctx.get(unit.i.ready):
                    await ctx.tick()
                    cycles += 1
                if n == 0:
                    waits.append(cycles)
                await ctx.tick()
            ctx.set(unit.i.valid, 0)
            # Each vector's sums come out before the next goes in: a wait is the lanes' own.
            while len(sums) < sum(matrices[i].shape[1] for i in sequence[:len(waits)]):
                await ctx.tick()

    async def receive(ctx):
        ctx.set(unit.o.ready, 1)
        async for _, _, valid, acc in ctx.tick().sample(unit.o.valid, unit.o.payload.acc):
            if valid:
                sums.append(acc[0])

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(send)
    sim.add_process(receive)
    sim.run_until(1e-5)
    assert waits == expected_waits
    assert sums == [v for index, x in zip(sequence, vectors) for v in matvec(np.array(x), matrices[index]).tolist()]


def test_order_names_distinct_matrices():
    with pytest.raises(ValueError, match="distinct indices"):
        lanes_plan([np.zeros((2, 2)), np.zeros((2, 2))], 2, order=[0, 0])
    with pytest.raises(ValueError, match="distinct indices"):
        lanes_plan([np.zeros((2, 2))], 2, order=[1])


@pytest.mark.parametrize("ways, lut_ways, lanes, seed", [(4, 1, 32, 0), (4, 0, 32, 1), (2, 1, 6, 2), (3, 0, 9, 3)])
def test_hidden_vector_stays_in_the_lanes(ways, lut_ways, lanes, seed):
    """The FFN's W1 and W2 as a `hidden` pair: W1's sums through the hidden rules (one folded
    rule for the shipped model's shifts, two otherwise) into W2, which takes the lanes' vector
    as it stands; between vectors of other matrices on `o` and the whole one's on `w`, with
    stalls on both sides. Every sum is the golden model's."""
    rng = np.random.default_rng(200 + seed)
    if lanes == 32:
        model = random_model(rng, 32, 4, 32, 29, 8)
        if seed == 0:
            model.requant["r_hid"] = (1, 3)  # a shift only: one rule
    else:
        model = random_model(rng, lanes, 1, lanes - 1, 11, 8)
    rules = hidden_rules(model.requant)
    assert len(rules) == (1 if seed == 0 else 2)
    w = model.weights
    matrices = [w["Wo"], w["W1"], w["W2"], w["Eq"].T]
    run(f"matvec_hidden{ways}_{lut_ways}_{lanes}", matrices, lanes=lanes, ways=ways, lut_ways=lut_ways, seed=seed,
        count=24, whole=3, hidden=hidden_param(1, 2, rules, w["W1"]))


def test_hidden_rules_at_the_edges():
    """Multipliers of the format's extremes (negative, zero, beyond 32 bits) and shifts 0 and
    63, with and without ReLU and saturation, on extreme weights."""
    rng = np.random.default_rng(9)
    first, second = rng.choice([-128, 127, 0, 1], (7, 8)), rng.integers(-128, 128, (8, 5))
    rules = [Rule(-3, 0, relu=False, saturate=False), Rule((1 << 40) + 12345, 41, relu=True, saturate=False),
             Rule(-(1 << 20) + 7, 63 - 40, relu=False, saturate=True)]
    run("matvec_hidden_edges", [first, second, np.full((5, 3), -128)], lanes=8, ways=2, seed=9, count=24,
        hidden=hidden_param(0, 1, rules, first))
    zero = [Rule(0, 5)]
    run("matvec_hidden_zero", [first, second], lanes=8, ways=2, seed=10, count=12,
        hidden=hidden_param(0, 1, zero, first))


def test_hidden_pair_on_the_ecp5_multipliers():
    """As elaborated for an ECP5 (the multipliers' own operand registers, enables on global
    buffers), simulated with the primitives' models: the same sums, stalls and all."""
    rng = np.random.default_rng(11)
    model = random_model(rng, 16, 2, 16, 16, 8)
    w = model.weights
    run("matvec_hidden_ecp5", [w["Wo"], w["W1"], w["W2"], w["Eq"].T], lanes=16, ways=4, lut_ways=1, seed=11,
        count=16, whole=3, hidden=hidden_param(1, 2, hidden_rules(model.requant), w["W1"]), platform=ECP5Cells())


def test_hidden_latency():
    """The second's first word leaves `hidden_latency` cycles after the first's last input
    word is taken, its words one a cycle: the vector does not stream out and back in."""
    from sim.latency import hidden_pair_timing
    rng = np.random.default_rng(12)
    matrices = [rng.integers(-128, 128, (32, 32)), rng.integers(-128, 128, (32, 32))]
    unit = lanes(matrices, 32, ways=4, lut_ways=1, order=[0, 1],
                 hidden=(0, 1, [Rule(19113, 22, relu=True)], matvec_bound(INT8, matrices[0])))
    latency = unit.plan.hidden.latency
    assert latency == 12  # 4 cycles' lead (the rule takes 2), the pipeline's 5, 3 of column sums
    assert hidden_pair_timing(unit) == [latency + word for word in range(8)]


def test_hidden_pair_must_fit():
    rng = np.random.default_rng(13)
    a, b = rng.integers(-128, 128, (4, 6)), rng.integers(-128, 128, (6, 3))
    rule = [Rule(1, 0)]
    with pytest.raises(ValueError, match="fit the 4 lanes"):
        lanes_plan([a, b], 4, hidden=(0, 1, rule, INT8))
    with pytest.raises(ValueError, match="follows matrix 0"):
        lanes_plan([a, b, a], 6, order=[0, 2, 1], hidden=(0, 1, rule, INT8))
    with pytest.raises(ValueError, match="neither the whole one"):
        lanes_plan([a, b], 6, whole=1, hidden=(0, 1, rule, INT8))
