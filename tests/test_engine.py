"""The decode engine end to end: whole generations on the simulated hardware, bit-exact."""

import numpy as np
import pytest

from hdl.engine import Engine
from int8model import load
from int8model.synthetic import random_model
from sim.runner import ECP5Cells, run_bench

SHIPPED = "models/zen32.json"


def run(name, model, lanes, prompts, seed=0, testcase=None, report=None, ways=3, lut_ways=0, attention_rows=2,
        qkv_table=None, platform=None, hidden_in_lanes=False):
    params = {"model": model.to_json(), "lanes": lanes, "prompts": prompts, "seed": seed,
              "report": report, "ways": ways, "lut_ways": lut_ways, "attention_rows": attention_rows,
              "qkv_table": qkv_table, "hidden_in_lanes": hidden_in_lanes}
    engine = Engine(model, lanes=lanes, ways=ways, lut_ways=lut_ways, attention_rows=attention_rows,
                    qkv_table=qkv_table, hidden_in_lanes=hidden_in_lanes)
    run_bench(engine, name=name,
              test_module="sim.bench_engine", params=params, testcase=testcase, platform=platform)


def test_shipped_model():
    """As the 85F is built: 32 lanes x 4 ways, one of them in LUT multipliers, elaborated for
    the ECP5 (its multipliers with their own registers, its global buffers) and simulated with
    the primitives' models."""
    model = load(SHIPPED)
    run("engine_shipped", model, 32, [[17, 9], [3, 1, 4, 1, 5]], testcase="generations_match_golden",
        ways=4, lut_ways=1, platform=ECP5Cells())


def test_shipped_model_with_the_hidden_vector_in_the_lanes():
    """As the 85F is built with ``--hidden-in-lanes``: W1's sums through the hidden rule in the
    lanes, W2 taking them as they stand; the hidden vector itself checked as it is made."""
    model = load(SHIPPED)
    run("engine_shipped_hidden", model, 32, [[17, 9], [3, 1, 4, 1, 5]], testcase="generations_match_golden",
        ways=4, lut_ways=1, platform=ECP5Cells(), hidden_in_lanes=True)


def test_the_hidden_vector_must_fit_the_lanes():
    model = load(SHIPPED)
    with pytest.raises(ValueError, match="do not fit the 16 lanes"):
        Engine(model, lanes=16, ways=2, hidden_in_lanes=True)


def test_shipped_model_as_on_the_45f():
    """16 lanes x 2 ways, one of them in LUTs: half the lanes of a d_model-wide product, each
    matrix in two groups of columns, the second replayed from the lanes' vector buffer."""
    model = load(SHIPPED)
    run("engine_shipped_45f", model, 16, [[3, 1, 4, 1, 5]], testcase="generations_match_golden",
        ways=2, lut_ways=1, platform=ECP5Cells())


def test_shipped_model_three_ways():
    """Without the q, k, v table: the QKV product in the lanes, its input from the xi table."""
    model = load(SHIPPED)
    run("engine_shipped_three_ways", model, 33, [[5, 30, 2]], testcase="generations_match_golden",
        qkv_table=False)


def test_shipped_model_one_element_a_cycle():
    """The smallest datapath: one element a cycle between the units, one cache row a cycle."""
    model = load(SHIPPED)
    run("engine_shipped_one_way", model, 32, [[17, 9]], testcase="generations_match_golden", ways=1,
        attention_rows=1)


@pytest.mark.slow
def test_shipped_model_four_cache_rows_a_cycle():
    """As the 85F is built with ``--attention-rows 4``: four banks of the cache, three of them
    weighed by LUT multipliers."""
    model = load(SHIPPED)
    run("engine_shipped_four_rows", model, 32, [[17, 9], [3, 1, 4, 1, 5]], testcase="generations_match_golden",
        ways=4, lut_ways=1, attention_rows=4)


def test_bad_input():
    rng = np.random.default_rng(3)
    model = random_model(rng, 16, 2, 24, 12, 8)
    run("engine_bad_input", model, 8, [], testcase="bad_input_is_reported_and_harmless", ways=2)


# d_model, heads, d_ff, vocab, seq_len, lanes, ways, of them in LUTs
SHAPES = [
    (8, 1, 12, 5, 8, 8, 1, 1), (8, 2, 16, 20, 12, 4, 2, 0), (16, 2, 24, 40, 16, 18, 3, 1),
    (16, 4, 8, 7, 10, 6, 3, 0), (32, 4, 48, 20, 24, 32, 4, 2), (32, 8, 16, 64, 9, 16, 2, 0),
    (64, 8, 96, 50, 16, 66, 3, 0), (64, 4, 32, 100, 12, 32, 1, 0), (16, 8, 40, 256, 20, 16, 4, 1),
    (32, 1, 64, 33, 40, 33, 3, 0), (8, 4, 8, 3, 64, 9, 3, 0),
]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d{}h{}f{}v{}c{}p{}w{}l{}".format(*s))
def test_random_models(shape):
    d, heads, d_ff, vocab, seq_len, lanes, ways, lut_ways = shape
    seed = sum(shape[:7])  # the models of the shapes before LUT ways were added
    rng = np.random.default_rng(seed)
    model = random_model(rng, d, heads, d_ff, vocab, seq_len, extreme=bool(seed % 3 == 0))
    prompt = rng.integers(0, vocab, size=int(rng.integers(1, seq_len // 2 + 1))).tolist()
    run("engine_{}_{}_{}_{}_{}_{}_{}_{}".format(*shape), model, lanes, [prompt], seed=seed,
        testcase="generations_match_golden", ways=ways, lut_ways=lut_ways)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[2] <= s[5]],
                         ids=lambda s: "d{}h{}f{}v{}c{}p{}w{}l{}".format(*s))
def test_random_models_with_the_hidden_vector_in_the_lanes(shape):
    """The shapes whose hidden vector fits the lanes, with it kept there (extreme rules among them)."""
    d, heads, d_ff, vocab, seq_len, lanes, ways, lut_ways = shape
    seed = sum(shape[:7]) + 1
    rng = np.random.default_rng(seed)
    model = random_model(rng, d, heads, d_ff, vocab, seq_len, extreme=bool(seed % 3 == 0))
    prompt = rng.integers(0, vocab, size=int(rng.integers(1, seq_len // 2 + 1))).tolist()
    run("engine_hidden_{}_{}_{}_{}_{}_{}_{}_{}".format(*shape), model, lanes, [prompt], seed=seed,
        testcase="generations_match_golden", ways=ways, lut_ways=lut_ways, hidden_in_lanes=True)


@pytest.mark.slow
def test_largest_shape():
    """d_model 64, d_ff 256, vocab 256, seq_len 256: the largest shape the engine takes."""
    rng = np.random.default_rng(64)
    model = random_model(rng, 64, 8, 256, 256, 256)
    prompt = rng.integers(0, 256, size=200).tolist()
    run("engine_largest", model, 66, [prompt], seed=64, testcase="generations_match_golden")
