import pytest

from hdl.divider import FloorDivider
from int8model.bounds import Bound
from plan.arithmetic import Rule
from plan.requant import divider_plan
from sim.bench_divider import build
from sim.latency import one_item
from sim.runner import run_bench


def divider(num, den, quotient, **options):
    return FloorDivider(divider_plan(num, den, quotient, **options))


@pytest.mark.parametrize("name, quotient, den, bits_per_stage, rule", [
    ("divider_int8", (-128, 127), (1, 2**20), 2, None),
    ("divider_int8_bit_a_stage", (-128, 127), (1, 2**20), 1, None),
    ("divider_int8_three_bits", (-128, 127), (1, 2**20), 3, None),
    ("divider_narrow", (-3, 90), (5, 777), 2, None),
    ("divider_single", (-7, -7), (1, 100), 2, None),
    ("divider_softmax", (-128, 127), (4096, 32 * 4096), 2, None),
    # r_ctx on the quotient, in the last stage: a random model's, a saturating one, a negative
    # multiplier; with a last stage of one bit, and a single stage.
    ("divider_rule", (-128, 127), (1, 2**20), 2, (348049, 18)),
    ("divider_rule_saturating", (-128, 127), (4096, 32 * 4096), 2, (5, 1)),
    ("divider_rule_negative", (-3, 90), (5, 777), 2, (-3, 1)),
    ("divider_rule_single_stage", (-2, 1), (1, 100), 2, (-70, 0)),
])
def test_divider(name, quotient, den, bits_per_stage, rule):
    num = (quotient[0] * den[1], (quotient[1] + 1) * den[1])
    params = {"num": list(num), "den": list(den), "quotient": list(quotient), "seed": 1, "count": 1500,
              "bits_per_stage": bits_per_stage, "rule": rule}
    run_bench(build(params), name=name, test_module="sim.bench_divider", params=params)


def test_refuses_non_positive_denominator():
    with pytest.raises(ValueError, match="denominator must be positive"):
        divider_plan(Bound(-10, 10), Bound(0, 5), Bound(-10, 10))


@pytest.mark.parametrize("quotient, bits_per_stage, latency", [
    ((-128, 127), 2, 4),   # int8: the offset (−128) goes into the first digit's trials
    ((-128, 127), 1, 8),
    ((-128, 127), 3, 4),   # its first trials are num + 96 · den, … : a stage for the offset
    ((-3, 90), 2, 5),
])
def test_latency(quotient, bits_per_stage, latency):
    """Cycles from a division taken to its quotient offered, with the output always ready."""
    unit = divider(Bound(-10**6, 10**6), Bound(1, 5000), Bound(*quotient), bits_per_stage=bits_per_stage)
    assert unit.latency == latency
    seen = one_item(unit, {"num": 1000, "den": 37}, read=lambda ctx: ctx.get(unit.o.payload.value))
    assert seen == [(latency, 1000 // 37)]


@pytest.mark.parametrize("quotient, steps", [((-128, 127), 8), ((-3, 90), 7), ((-2, 1), 2)])
def test_rule_costs_no_cycle(quotient, steps):
    """With a rule, the divider leaves the rule's result on the quotient, as many cycles after
    the division is taken as without one."""
    rule = Rule.to8((348049, 18))
    plain = divider(Bound(-10**6, 10**6), Bound(1, 5000), Bound(*quotient))
    unit = divider(Bound(-10**6, 10**6), Bound(1, 5000), Bound(*quotient), rule=rule)
    assert unit.plan.steps == steps
    num = 37 * max(quotient) - 5
    seen = one_item(unit, {"num": num, "den": 37}, read=lambda ctx: ctx.get(unit.o.payload.value))
    assert seen == [(plain.latency, rule.apply(num // 37))]
