import pytest

from hdl.divider import FloorDivider
from int8model.bounds import Bound
from sim.latency import one_item
from sim.runner import run_bench


@pytest.mark.parametrize("name, quotient, den, bits_per_stage", [
    ("divider_int8", (-128, 127), (1, 2**20), 2),
    ("divider_int8_bit_a_stage", (-128, 127), (1, 2**20), 1),
    ("divider_int8_three_bits", (-128, 127), (1, 2**20), 3),
    ("divider_narrow", (-3, 90), (5, 777), 2),
    ("divider_single", (-7, -7), (1, 100), 2),
    ("divider_softmax", (-128, 127), (4096, 32 * 4096), 2),
])
def test_divider(name, quotient, den, bits_per_stage):
    num = (quotient[0] * den[1], (quotient[1] + 1) * den[1])
    params = {"num": list(num), "den": list(den), "quotient": list(quotient), "seed": 1, "count": 1500,
              "bits_per_stage": bits_per_stage}
    unit = FloorDivider(Bound(*num), Bound(*den), Bound(*quotient), bits_per_stage=bits_per_stage)
    run_bench(unit, name=name, test_module="sim.bench_divider", params=params)


def test_refuses_non_positive_denominator():
    with pytest.raises(ValueError, match="denominator must be positive"):
        FloorDivider(Bound(-10, 10), Bound(0, 5), Bound(-10, 10))


@pytest.mark.parametrize("quotient, bits_per_stage, latency", [
    ((-128, 127), 2, 4),   # int8: the offset (−128) goes into the first digit's trials
    ((-128, 127), 1, 8),
    ((-128, 127), 3, 4),   # its first trials are num + 96 · den, … : a stage for the offset
    ((-3, 90), 2, 5),
])
def test_latency(quotient, bits_per_stage, latency):
    """Cycles from a division taken to its quotient offered, with the output always ready."""
    unit = FloorDivider(Bound(-10**6, 10**6), Bound(1, 5000), Bound(*quotient), bits_per_stage=bits_per_stage)
    assert unit.latency == latency
    seen = one_item(unit, {"num": 1000, "den": 37}, read=lambda ctx: ctx.get(unit.o.payload.value))
    assert seen == [(latency, 1000 // 37)]
