import numpy as np
import pytest

from hdl.matvec import MatVec
from int8model.synthetic import random_model
from sim.runner import run_bench


def run(name, matrices, lanes, seed, count=60, idle=0.3, stall=0.3, banks=1, banked=()):
    params = {"matrices": [np.asarray(w).tolist() for w in matrices], "lanes": lanes,
              "seed": seed, "count": count, "idle": idle, "stall": stall,
              "banks": banks, "banked": list(banked)}
    run_bench(MatVec(matrices, lanes, banks=banks, banked=banked), name=name,
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


def test_full_speed_without_stalls():
    rng = np.random.default_rng(5)
    run("matvec_full_speed", [rng.integers(-128, 128, (16, 40))], lanes=16, seed=5, idle=0, stall=0)


@pytest.mark.parametrize("lanes", [3, 8])
def test_banks_compute_blocks_at_once(lanes):
    """q, k and v as one banked matrix: each bank its own block of columns and its own output."""
    rng = np.random.default_rng(100 + lanes)
    model = random_model(rng, 8, 2, 12, 10, 8)
    w = model.weights
    matrices = [np.concatenate([w["Wq"], w["Wk"], w["Wv"]], axis=1), w["Wo"], w["W1"], w["W2"], w["Eq"].T]
    run(f"matvec_banks{lanes}", matrices, lanes=lanes, seed=lanes, banks=3, banked=[0])


def test_banked_columns_must_split_evenly():
    with pytest.raises(ValueError, match="do not split into 3 banks"):
        MatVec([np.zeros((2, 7), dtype=int)], 2, banks=3, banked=[0])
