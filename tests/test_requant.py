import numpy as np
import pytest

from amaranth.hdl import unsigned

from hdl.requant import Requant
from int8model import load
from int8model.bounds import Bound
from int8model.format import REQUANTS
from int8model.synthetic import random_model
from plan.arithmetic import LoadedRule, ResultTable, Rule, signed_digits
from plan.requant import requant_plan
from sim.bench_requant import build
from sim.latency import one_item
from sim.runner import ECP5Cells, generated_verilog, run_bench


def requant(in_bound, rules, *, tag_shape=unsigned(0), **options):
    """A requant unit of ``rules`` for inputs in ``in_bound``, with the plan's ``options``."""
    return Requant(requant_plan(in_bound, rules, **options), tag_shape=tag_shape)

EDGE_RULES = [
    Rule(1, 0), Rule(-1, 0), Rule(1, 63), Rule(-1, 63), Rule(2**40 - 1, 63), Rule(-(2**40), 63),
    Rule(123456789, 20), Rule(-98765, 7), Rule(3, 0, saturate=False), Rule(-7, 2, relu=True),
    Rule(2**30, 40, relu=True, saturate=False), Rule(0, 5), Rule(-(2**41), 0, saturate=False),
]


def run(name, in_bound, rules, seed, count=2000, registered_input=False, addend_bounds=None, multiplier_input=False,
        sum_stage=False, followed_by=None, platform=None, loaded=None):
    bounds = [[b.lo, b.hi] for b in in_bound] if isinstance(in_bound, list) else [in_bound.lo, in_bound.hi]
    params = {"in_bound": bounds,
              "rules": [[r.multiplier, r.shift, r.relu, r.saturate] for r in rules],
              "seed": seed, "count": count, "registered_input": registered_input,
              "addend_bounds": None if addend_bounds is None else [a and [a.lo, a.hi] for a in addend_bounds],
              "multiplier_input": multiplier_input, "sum_stage": sum_stage, "loaded": loaded,
              "followed_by": followed_by and [r and [r.multiplier, r.shift, r.relu, r.saturate] for r in followed_by]}
    run_bench(build(params), name=name,
              test_module="sim.bench_requant", params=params, platform=platform)


def test_widths_follow_the_bounds():
    plan = requant_plan(Bound(-1000, 1000), [Rule(5, 2, saturate=False)])
    assert plan.product_bits == Bound(-5000, 5000).bits
    assert plan.out_bits == Bound(-1250, 1250).bits
    assert requant_plan(Bound(-2**20, 2**20), [Rule(1, 0)]).out_bits == 8


PER_RULE = [  # each rule's own input range, and what the rules make of it
    (Bound(-200_000, 200_000), Rule(17417, 18, saturate=False)),  # → ±13,289
    (Bound(-(2**40), 2**40), Rule(3, 40)),                          # → int8
    (Bound(-5, 5), Rule(1, 0, saturate=False)),
]


def test_widths_follow_each_rules_bound():
    bounds, rules = [b for b, _ in PER_RULE], [r for _, r in PER_RULE]
    plan = requant_plan(bounds, rules)
    assert plan.in_bits == Bound(-(2**40), 2**40).bits
    # Against the union of the inputs, the first rule alone would need 42 + 15 bits.
    assert plan.product_bits == max(Bound(-(2**40), 2**40).times(3).bits, Bound(-200_000, 200_000).times(17417).bits)
    assert plan.out_bits == Bound(-13289, 13288).bits
    assert requant_plan(Bound(-(2**40), 2**40), rules).out_bits > plan.out_bits
    with pytest.raises(ValueError, match="2 input bounds for 3 rules"):
        requant_plan(bounds[:2], rules)


ADDING = [  # a rule's input range, the rule, and the range of what it adds after the shift
    (Bound(-200_000, 200_000), Rule(17417, 18, saturate=False), Bound(-30_000, 30_000)),  # s1 = x + rq
    (Bound(-200_000, 200_000), Rule(19113, 19, relu=True, saturate=False), None),
    (Bound(-2**21, 2**21 - 1), Rule(-98765, 7), Bound(-2**20, 2**20)),   # clamps after the add
    (Bound(-1000, 1000), Rule(3, 63, relu=True), Bound(-5, 5)),            # the add alone decides
]


@pytest.mark.parametrize("registered_input, sum_stage", [(False, False), (True, False), (True, True)])
def test_addends(registered_input, sum_stage):
    """``clamp((x · M >> S) + addend)``, the addend's range in the widths, against the golden
    model (and so with the sum in a stage of its own, as the epilogue's first requant has it)."""
    bounds, rules, addends = zip(*ADDING)
    plan = requant_plan(list(bounds), list(rules), addend_bounds=list(addends))
    assert plan.product_bits == max(r.sum_bound(b, a).bits for b, r, a in ADDING)
    assert plan.out_bound.hi >= 200_000 * 17417 // 2**18 + 30_000
    run(f"requant_addends{'_registered' if registered_input else ''}{'_sum_stage' if sum_stage else ''}",
        list(bounds), list(rules), seed=8, count=1500, registered_input=registered_input,
        addend_bounds=list(addends), sum_stage=sum_stage)


def test_multipliers_from_the_input():
    """Each input brings its rule's multiplier (the epilogue's last requant): the same results."""
    run("requant_multiplier_input", Bound(-2**21, 2**21 - 1), EDGE_RULES, seed=10, registered_input=True,
        multiplier_input=True)


LOADED = [  # a loadable build's rules: an 18-bit multiplier, any shift, ReLU and clamps as the stage has them
    (Bound(-2**20, 2**20), Rule(131071, 0, saturate=False), Bound(-2**23, 2**23 - 1)),
    (Bound(-2**20, 2**20), Rule(-131072, 63), None),
    (Bound(-2**20, 2**20), Rule(17417, 18, saturate=False), Bound(-30_000, 30_000)),
    (Bound(-2**20, 2**20), Rule(19113, 19, relu=True, saturate=False), None),
    (Bound(-2**20, 2**20), Rule(-98765, 7), Bound(-2**20, 2**20)),
    (Bound(-2**20, 2**20), Rule(3, 1), None),
    (Bound(-2**20, 2**20), Rule(0, 0, saturate=False), None),
    (Bound(-2**20, 2**20), Rule(1, 0), Bound(-5, 5)),
]


@pytest.mark.parametrize("registered_input, sum_stage", [(False, False), (True, True)])
def test_loaded_rules(registered_input, sum_stage):
    """A loadable build's requant: each input brings its rule's multiplier and shift (any
    shift, so a shifter), the addend added after the shift; against the golden model."""
    bounds, rules, addends = zip(*LOADED)
    loaded = [LoadedRule(18, r.relu, r.saturate) for r in rules]
    plan = requant_plan(list(bounds), loaded, addend_bounds=list(addends), multiplier_input=True,
                        registered_input=registered_input, sum_stage=sum_stage)
    assert plan.loaded and plan.multiplier_bits == 18 and not plan.shift_only
    assert plan.latency == (not registered_input) + 1 + sum_stage + 1 + 1
    run(f"requant_loaded{'_registered' if registered_input else ''}", list(bounds), list(rules), seed=12,
        count=1500, registered_input=registered_input, addend_bounds=list(addends), multiplier_input=True,
        sum_stage=sum_stage, loaded=18)


def test_addends_to_powers_of_two():
    rules = [Rule(4, 3, saturate=False), Rule(1, 0), Rule(0, 2, relu=True)]
    run("requant_addends_shift_only", Bound(-2**21, 2**21 - 1), rules, seed=9, count=800,
        addend_bounds=[Bound(-2**18, 2**18), Bound(-300, 300), Bound(-3, 3)])


@pytest.mark.parametrize("registered_input", [False, True])
def test_each_rules_bound(registered_input):
    run(f"requant_per_rule{'_registered' if registered_input else ''}", [b for b, _ in PER_RULE],
        [r for _, r in PER_RULE], seed=4, count=1000, registered_input=registered_input)


@pytest.mark.parametrize("registered_input", [False, True])
def test_edge_rules(registered_input):
    run(f"requant_edges{'_registered' if registered_input else ''}", Bound(-2**21, 2**21 - 1), EDGE_RULES,
        seed=1, registered_input=registered_input)


@pytest.mark.parametrize("index", [2, 5, 9])
def test_single_rule(index):
    run(f"requant_single{index}", Bound(-2**21, 2**21 - 1), [EDGE_RULES[index]], seed=index, count=500)


@pytest.mark.parametrize("seed", [2, 3])
def test_rules_of_random_models(seed):
    rng = np.random.default_rng(seed)
    model = random_model(rng, 16, 2, 24, 16, 16, extreme=True)
    rules = [Rule.to8(model.requant[k]) for k in REQUANTS] + [Rule.rq(model.requant["M_h"], relu=True)]
    run(f"requant_random{seed}", Bound(-2**18, 2**18), rules, seed=seed)


@pytest.mark.parametrize("wide, multipliers", [(False, 2), (True, 4)])
def test_ecp5_multipliers_in_their_own_registers(wide, multipliers):
    """Elaborated as for an ECP5, as the epilogue's last requant is (each input with its rule's
    multiplier): the operands go into the MULT18X18Ds' own input registers, a wide input's
    product in two of them (22 bits: 17 low bits, 5 high), and where a multiplier is wider than
    18 bits too (348049, 20 bits signed), each of those in two again; as many as the plan
    counts. Simulated with the primitives' models, against the golden model."""
    model = load("models/zen32.json")
    rules = [Rule.to8(model.requant[k]) for k in REQUANTS] + [Rule.rq(model.requant["M_h"], relu=True)]
    if wide:
        rules.append(Rule.to8((348049, 18)))
    name = f"requant_ecp5{'_wide' if wide else ''}"
    run(name, Bound(-2**21, 2**21 - 1), rules, seed=11, count=1500, multiplier_input=True, platform=ECP5Cells())
    planned = requant_plan(Bound(-2**21, 2**21 - 1), rules, multiplier_input=True).multipliers
    assert generated_verilog(name).count("MULT18X18D #(") == planned == multipliers


SHIFT_ONLY = [Rule(1, 0), Rule(4, 3, saturate=False), Rule(0, 2), Rule(2**20, 25, relu=True), Rule(1, 63)]


@pytest.mark.parametrize("registered_input", [False, True])
def test_powers_of_two(registered_input):
    run(f"requant_shift_only{'_registered' if registered_input else ''}", Bound(-2**21, 2**21 - 1),
        SHIFT_ONLY, seed=5, count=1000, registered_input=registered_input)


NARROW, WIDE = Bound(-1000, 1000), Bound(-2**21, 2**21 - 1)  # WIDE: a product cut in two


@pytest.mark.parametrize("bound, rules, registered_input, sum_stage, cycles", [
    (NARROW, SHIFT_ONLY, True, False, 1), (NARROW, SHIFT_ONLY, False, False, 2),
    (NARROW, [Rule(3, 1)], True, False, 2), (NARROW, [Rule(3, 1)], False, False, 3),
    (NARROW, SHIFT_ONLY + [Rule(3, 1)], True, False, 2),
    (WIDE, [Rule(3, 1)], True, False, 2), (WIDE, [Rule(3, 1)], False, False, 3),
    (WIDE, [Rule(3, 1)], True, True, 3), (NARROW, SHIFT_ONLY, False, True, 3),
], ids=lambda v: None if not isinstance(v, Bound) else ("wide" if v is WIDE else "narrow"))
def test_latency(bound, rules, registered_input, sum_stage, cycles):
    """Cycles from a value taken to its result offered, with the output always ready: a
    product cut in two adds its halves in the last stage, as it clamps (or in a stage of its
    own, with ``sum_stage``)."""
    unit = requant(bound, rules, registered_input=registered_input, sum_stage=sum_stage)
    assert unit.plan.in_bits == (22 if bound is WIDE else 11)
    seen = one_item(unit, {"value": 77}, cycles=8)
    assert seen == [cycles] == [unit.plan.latency]


def test_a_rule_on_one_integer_is_the_golden_requant():
    """Rule.apply (the tables built at elaboration) against the golden model's rq and c8."""
    from int8model.golden import c8, rq
    rng = np.random.default_rng(6)
    for rule in EDGE_RULES:
        for value in [0, 1, -1, 2**21 - 1, -(2**21)] + rng.integers(-2**21, 2**21, 50).tolist():
            want = rq(np.int64(value), (rule.multiplier, rule.shift))
            want = np.maximum(want, 0) if rule.relu else want
            want = c8(want) if rule.saturate else want
            assert rule.apply(value) == int(want), (rule, value)


def test_a_shifting_rule_folds_into_the_one_before():
    """Rule.then against the two rules one after the other: where the second multiplies by a
    power of two, 2^k, and shifts by at least k, one rule gives the same on every value."""
    rng = np.random.default_rng(9)
    values = [0, 1, -1, 7, -8, 2**40, -(2**40)] + rng.integers(-2**40, 2**40, 300).tolist()
    firsts = [Rule.rq((19113, 19), relu=True), Rule.rq((-77, 5)), Rule.rq((3, 0), relu=True), Rule.rq((1, 55))]
    lasts = [Rule.to8((1, 3)), Rule.to8((4, 2)), Rule.to8((8, 9)), Rule(2, 1, relu=True), Rule(1, 0, saturate=False)]
    for first in firsts:
        for last in lasts:
            both = first.then(last)
            if first.shift + last.shift - (last.multiplier.bit_length() - 1) > 63:
                assert both is None, (first, last)
                continue
            for value in values:
                assert both.apply(value) == last.apply(first.apply(value)), (first, last, value)
    # A multiplier not a power of two, one shifting up more than down, a saturating first rule.
    assert Rule.rq((5, 2)).then(Rule.to8((3, 4))) is None
    assert Rule.rq((5, 2)).then(Rule.to8((8, 2))) is None
    assert Rule.rq((5, 2)).then(Rule.to8((-4, 3))) is None
    assert Rule.rq((5, 2)).then(Rule.to8((0, 3))) is None
    assert Rule.to8((5, 2)).then(Rule.to8((1, 0))) is None
    assert Rule.rq((1, 60)).then(Rule.to8((1, 4))) is None  # a shift past 63


@pytest.mark.parametrize("rule, bound, identity", [
    (Rule.to8((1, 0)), Bound(-128, 127), True), (Rule.to8((8, 3)), Bound(-128, 127), True),
    (Rule.to8((1, 0)), Bound(-129, 0), False), (Rule.to8((1, 0)), Bound(0, 128), False),
    (Rule.rq((1, 0)), Bound(-1000, 1000), True), (Rule.to8((3, 1)), Bound(-1, 1), False),
    (Rule.to8((2, 0)), Bound(0, 0), False), (Rule(1, 0, relu=True), Bound(-1, 5), False),
    (Rule(1, 0, relu=True), Bound(0, 5), True),
])
def test_identity_rules(rule, bound, identity):
    """Rule.is_identity_on, and where it says so, every value of the bound comes back unchanged."""
    assert rule.is_identity_on(bound) == identity
    if identity:
        assert all(rule.apply(v) == v for v in range(bound.lo, bound.hi + 1))


def test_signed_digits_make_the_multiplier_with_no_two_adjacent():
    for value in [0, 1, -1, 3, -3, 7, 19113, -19113, 2**40 - 1, -(2**41), 0x5555, 123456789]:
        digits = signed_digits(value)
        assert sum(sign << shift for shift, sign in digits) == value
        shifts = [shift for shift, _ in digits]
        assert all(b - a >= 2 for a, b in zip(shifts, shifts[1:]))
    assert len(signed_digits(0b0111_1111)) == 2  # 128 − 1


@pytest.mark.parametrize("chain", [[Rule(19113, 22, relu=True)],
                                   [Rule(3, 9, relu=True, saturate=False), Rule(7448, 13)],
                                   EDGE_RULES[:6], EDGE_RULES[6:]])
def test_constant_requant_chain(chain):
    """The chain in LUT logic, every value of a range through it on Amaranth's simulator, each
    result ``latency`` cycles later, as the rules apply one after another."""
    from amaranth.hdl import Module, Signal, signed
    from amaranth.sim import Simulator
    from hdl.requant import ConstantRequant
    bound = Bound(-(2**19), 2**19 - 1)
    m = Module()
    value = Signal(signed(bound.bits))
    unit = ConstantRequant(m, value, bound, chain, name="chain")
    assert unit.stages == ConstantRequant.latency(chain)
    rng = np.random.default_rng(len(chain))
    values = [bound.lo, bound.hi, 0, -1, 1] + rng.integers(bound.lo, bound.hi + 1, 300).tolist()
    got = []

    async def bench(ctx):
        for n in range(len(values) + unit.stages):
            if n < len(values):
                ctx.set(value, values[n])
            await ctx.tick()
            if n >= unit.stages - 1 and len(got) < len(values):
                got.append(ctx.get(unit.result))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = []
    for x in values:
        for rule in chain:
            x = rule.apply(x)
        want.append(x)
    assert got == want


IDENTITY = Rule(1, 0, saturate=False)


@pytest.mark.parametrize("bound, first, then, entries", [
    (Bound(0, 1812), IDENTITY, Rule(7448, 13), 140),    # a random model's r_hid on its ReLU's range
    (Bound(0, 2043), IDENTITY, Rule(36382, 16), 229),
    (Bound(-300, 300), IDENTITY, Rule(-3, 1), 171),     # a negative multiplier: results fall
    (Bound(0, 10), IDENTITY, Rule(1, 0), 11),           # nothing saturates: every input an entry
    (Bound(5, 5), IDENTITY, Rule(9, 2), 1),
    (Bound(-200, 200), IDENTITY, Rule(3, 2, relu=True, saturate=False), 200),  # 0 up to 1, then rising
    (Bound(-200_000, 200_000), Rule(19113, 19, relu=True, saturate=False), Rule(7448, 13), None),  # M_h, r_hid
    (Bound(-20_000, 20_000), Rule(3, 8, saturate=False), Rule(-5, 2), None),  # negative results into the table
])
def test_followed_by_a_table(bound, first, then, entries):
    """A rule followed by a table of another's results, beside a rule with none, on Amaranth's
    simulator, the output stalling now and then: each result the two rules' one after the other,
    as many cycles after it is taken as without the table. The table holds only the inputs
    between the two runs of constant results."""
    from amaranth.sim import Simulator
    middle = first.result_bound(bound)
    if entries is not None:
        assert ResultTable.size(middle, then) == entries
    other = Rule(5, 2)
    unit = requant(bound, [first, other], followed_by=[then, None], tag_shape=range(1 << 12))
    tabled, plain_results = then.result_bound(middle), other.result_bound(bound)
    assert unit.plan.out_bound == Bound(min(tabled.lo, plain_results.lo), max(tabled.hi, plain_results.hi))
    plain = requant(bound, [first, other], tag_shape=range(1 << 12))
    assert one_item(unit, {"value": bound.hi, "select": 0}) == one_item(plain, {"value": bound.hi, "select": 0})
    rng = np.random.default_rng(bound.hi)
    values = list(range(bound.lo, bound.hi + 1))
    if len(values) > 6000:  # every input of the table's span and past it, and some far away
        span = [x for x in range(-6000, 6000) if middle.lo <= first.apply(x) <= min(middle.hi, 4 * middle.lo + 4000)]
        values = [bound.lo, bound.hi] + span + rng.integers(bound.lo, bound.hi + 1, 2000).tolist()
    items = [(x, int(rng.integers(2))) for x in values]
    got = []

    async def bench(ctx):
        sent = 0
        while len(got) < len(items):
            ctx.set(unit.i.valid, sent < len(items))
            if sent < len(items):
                ctx.set(unit.i.payload.value, items[sent][0])
                ctx.set(unit.i.payload.select, items[sent][1])
                ctx.set(unit.i.payload.tag, sent % (1 << 12))
            ready = bool(rng.random() > 0.2)
            ctx.set(unit.o.ready, ready)
            taken = sent < len(items) and ctx.get(unit.i.ready)
            if ctx.get(unit.o.valid) and ready:
                got.append((ctx.get(unit.o.payload.value), ctx.get(unit.o.payload.tag)))
            sent += taken
            await ctx.tick()

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = [(then.apply(first.apply(x)) if select == 0 else other.apply(x), n % (1 << 12))
            for n, (x, select) in enumerate(items)]
    assert got == want


def test_at_most_a_constant_as_logic():
    """The table's ends, judged without a comparison: every value of a few widths against
    constants inside, at and past each end of their range."""
    from amaranth.hdl import Module, Signal, signed
    from amaranth.sim import Simulator
    from hdl.requant import at_most
    m = Module()
    cases = []
    for width in (1, 2, 5):
        value = Signal(signed(width), name=f"value{width}")
        for constant in range(-(1 << width) - 1, (1 << width) + 2):
            out = Signal(name=f"at_most_{width}_{constant + 64}")
            m.d.comb += out.eq(at_most(value, constant))
            cases.append((width, value, constant, out))
    wrong = []

    async def bench(ctx):
        for width, value, constant, out in cases:
            for x in range(-(1 << width - 1), 1 << width - 1):
                ctx.set(value, x)
                if ctx.get(out) != (x <= constant):
                    wrong.append((width, x, constant))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not wrong


@pytest.mark.parametrize("signed_product", [True, False])
@pytest.mark.parametrize("nlut", [1, 5, 8])
def test_a_shifted_clamp_judged_beside_its_shift(signed_product, nlut):
    """A deep model's exp table index, ``clamp(scaled >> shift, 0, nlut − 1)`` with its layer's
    shift, from registers with its clamp already judged: every product of a few bits, every
    layer's shift."""
    from amaranth.hdl import Module, Signal, signed, unsigned
    from amaranth.sim import Simulator
    from hdl.requant import shifted_clamp
    shifts = [0, 1, 3, 6]
    scaled = Signal(signed(7) if signed_product else unsigned(6))
    layer = Signal(range(len(shifts)))
    m = Module()
    index = Signal(8)
    m.d.comb += index.eq(shifted_clamp(m, scaled, shifts, layer, nlut, "index"))
    values = range(-64, 64) if signed_product else range(64)
    wrong = []

    async def bench(ctx):
        for n, shift in enumerate(shifts):
            for value in values:
                ctx.set(scaled, value)
                ctx.set(layer, n)
                await ctx.tick()
                if ctx.get(index) != min(max(value >> shift, 0), nlut - 1):
                    wrong.append((n, value, ctx.get(index)))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert not wrong


def test_a_table_follows_only_a_rule_that_does_not_saturate():
    with pytest.raises(ValueError, match="rule 0 saturates"):
        requant_plan(Bound(0, 100), [Rule(1, 0)], followed_by=[Rule(3, 2)])
    with pytest.raises(ValueError, match="rule 1's table would take 1001 entries, more than 256"):
        requant_plan(Bound(0, 1000), [Rule(1, 0), IDENTITY], followed_by=[None, Rule(1, 0, saturate=False)])


def test_followed_by_a_table_on_icarus():
    """The rules of the epilogue's first requant for a random model, ``M_h``'s followed by
    ``r_hid``'s table, against the golden model. ``M_h``'s inputs are drawn from around the
    table's span (a few hundredths of the model's range), the others' from all of it."""
    from plan import Stage, make_plan
    model = random_model(np.random.default_rng(1), 32, 4, 32, 32, 32)
    unit = make_plan(model).epilogue.first
    assert [t is not None for t in unit.tables] == [stage == Stage.H for stage in Stage]
    hidden, table = unit.rules[Stage.H], unit.tables[Stage.H]
    bounds = [unit.in_bound] * len(unit.rules)
    one = 1 << hidden.shift
    bounds[Stage.H] = Bound(-one, (table.last + 1) * one // hidden.multiplier + one)
    run("requant_followed_by_a_table", bounds, unit.rules, seed=12, count=1500,
        followed_by=[t and t.rule for t in unit.tables])
