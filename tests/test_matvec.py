import numpy as np
import pytest

from hdl.matvec import MatVec
from int8model.synthetic import random_model
from sim.runner import run_bench


def run(name, matrices, lanes, seed, count=60, idle=0.3, stall=0.3, ways=1, lut_ways=0):
    params = {"matrices": [np.asarray(w).tolist() for w in matrices], "lanes": lanes, "ways": ways,
              "lut_ways": lut_ways, "seed": seed, "count": count, "idle": idle, "stall": stall}
    run_bench(MatVec(matrices, lanes, ways=ways, lut_ways=lut_ways), name=name,
              test_module="sim.bench_matvec", params=params)


def test_accumulator_width_follows_the_weights():
    w = np.full((4, 3), -128)
    unit = MatVec([w], 2)
    assert unit.acc_bound.hi == 4 * 128 * 128 and unit.acc_bound.lo == 4 * 127 * -128
    assert unit.acc_bits == 18
    assert unit.groups == [2] and unit.depth == 8


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


def test_lanes_must_be_a_multiple_of_the_ways():
    with pytest.raises(ValueError, match="multiple of the ways"):
        MatVec([np.zeros((2, 7), dtype=int)], 4, ways=3)


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


def test_lut_ways_take_at_most_the_ways():
    with pytest.raises(ValueError, match="0 to 2"):
        MatVec([np.zeros((2, 2))], 2, ways=2, lut_ways=3)
