import pytest

from hdl.divider import FloorDivider
from int8model.bounds import Bound
from sim.runner import run_bench


@pytest.mark.parametrize("name, quotient, den", [
    ("divider_int8", (-128, 127), (1, 2**20)),
    ("divider_narrow", (-3, 90), (5, 777)),
    ("divider_single", (-7, -7), (1, 100)),
    ("divider_softmax", (-128, 127), (4096, 32 * 4096)),
])
def test_divider(name, quotient, den):
    num = (quotient[0] * den[1], (quotient[1] + 1) * den[1])
    params = {"num": list(num), "den": list(den), "quotient": list(quotient), "seed": 1, "count": 1500}
    unit = FloorDivider(Bound(*num), Bound(*den), Bound(*quotient))
    run_bench(unit, name=name, test_module="sim.bench_divider", params=params)


def test_refuses_non_positive_denominator():
    with pytest.raises(ValueError, match="denominator must be positive"):
        FloorDivider(Bound(-10, 10), Bound(0, 5), Bound(-10, 10))
