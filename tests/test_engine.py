"""The decode engine end to end: whole generations on the simulated hardware, bit-exact."""

import json

import numpy as np
import pytest

from int8model import load
from int8model.synthetic import random_model
from plan import FitError, Shape, choose_plan, make_plan
from sim.bench_engine import run_engine
from sim.runner import ECP5Cells

SHIPPED = "models/zen32.json"


def test_shipped_model():
    """As the 85F is built: 32 lanes x 4 ways, one of them in LUT multipliers, elaborated for
    the ECP5 (its multipliers with their own registers, its global buffers) and simulated with
    the primitives' models."""
    run_engine(load(SHIPPED), Shape(32, 4, 1), [[17, 9], [3, 1, 4, 1, 5]], name="engine_shipped",
               platform=ECP5Cells())


def test_shipped_model_with_the_hidden_vector_in_the_lanes():
    """As the 85F is built with ``--hidden-in-lanes``: W1's sums through the hidden rule in the
    lanes, W2 taking them as they stand; the hidden vector itself checked as it is made."""
    run_engine(load(SHIPPED), Shape(32, 4, 1, hidden_in_lanes=True), [[17, 9], [3, 1, 4, 1, 5]],
               name="engine_shipped_hidden", platform=ECP5Cells())


def test_the_hidden_vector_must_fit_the_lanes():
    with pytest.raises(FitError, match="do not fit the 16 lanes"):
        make_plan(load(SHIPPED), Shape(16, 2, hidden_in_lanes=True))


def test_shipped_model_in_quarter_lanes():
    """8 lanes x 4 ways, one of them in LUTs (the 45F's choice): a quarter of a d_model-wide
    product's lanes, each matrix in four groups of columns, the others replayed from the lanes'
    vector buffer."""
    run_engine(load(SHIPPED), Shape(8, 4, 1), [[3, 1, 4, 1, 5]], name="engine_shipped_45f", platform=ECP5Cells())


def test_shipped_model_two_ways_half_lanes():
    """16 lanes x 2 ways, one of them in LUTs: half the lanes, each matrix in two groups."""
    run_engine(load(SHIPPED), Shape(16, 2, 1), [[3, 1, 4, 1, 5]], name="engine_shipped_half", platform=ECP5Cells())


def test_shipped_model_three_ways():
    """Without the q, k, v table: the QKV product in the lanes, its input from the xi table."""
    run_engine(load(SHIPPED), Shape(33, 3, qkv_table=False), [[5, 30, 2]], name="engine_shipped_three_ways")


def test_shipped_model_one_element_a_cycle():
    """The smallest datapath: one element a cycle between the units, one cache row a cycle."""
    run_engine(load(SHIPPED), Shape(32, 1, attention_rows=1), [[17, 9]], name="engine_shipped_one_way")


@pytest.mark.slow
def test_shipped_model_four_cache_rows_a_cycle():
    """As the 85F is built with ``--attention-rows 4``: four banks of the cache, three of them
    weighed by LUT multipliers."""
    run_engine(load(SHIPPED), Shape(32, 4, 1, attention_rows=4), [[17, 9], [3, 1, 4, 1, 5]],
               name="engine_shipped_four_rows")


def test_bad_input():
    rng = np.random.default_rng(3)
    model = random_model(rng, 16, 2, 24, 12, 8)
    run_engine(model, Shape(8, 2), [], name="engine_bad_input", testcase="bad_input_is_reported_and_harmless")


# d_model, heads, d_ff, vocab, seq_len, lanes, ways, of them in LUTs
SHAPES = [
    (8, 1, 12, 5, 8, 8, 1, 1), (8, 2, 16, 20, 12, 4, 2, 0), (16, 2, 24, 40, 16, 18, 3, 1),
    (16, 4, 8, 7, 10, 6, 3, 0), (32, 4, 48, 20, 24, 32, 4, 2), (32, 8, 16, 64, 9, 16, 2, 0),
    (64, 8, 96, 50, 16, 66, 3, 0), (64, 4, 32, 100, 12, 32, 1, 0), (16, 8, 40, 256, 20, 16, 4, 1),
    (32, 1, 64, 33, 40, 33, 3, 0), (8, 4, 8, 3, 64, 9, 3, 0),
]


def shape_id(s):
    return "d{}h{}f{}v{}c{}p{}w{}l{}".format(*s)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_random_models(shape):
    d, heads, d_ff, vocab, seq_len, lanes, ways, lut_ways = shape
    seed = sum(shape[:7])  # the models of the shapes before LUT ways were added
    rng = np.random.default_rng(seed)
    model = random_model(rng, d, heads, d_ff, vocab, seq_len, extreme=bool(seed % 3 == 0))
    prompt = rng.integers(0, vocab, size=int(rng.integers(1, seq_len // 2 + 1))).tolist()
    run_engine(model, Shape(lanes, ways, lut_ways), [prompt], name=f"engine_{shape_id(shape)}", seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[2] <= s[5]], ids=shape_id)
def test_random_models_with_the_hidden_vector_in_the_lanes(shape):
    """The shapes whose hidden vector fits the lanes, with it kept there (extreme rules among them)."""
    d, heads, d_ff, vocab, seq_len, lanes, ways, lut_ways = shape
    seed = sum(shape[:7]) + 1
    rng = np.random.default_rng(seed)
    model = random_model(rng, d, heads, d_ff, vocab, seq_len, extreme=bool(seed % 3 == 0))
    prompt = rng.integers(0, vocab, size=int(rng.integers(1, seq_len // 2 + 1))).tolist()
    run_engine(model, Shape(lanes, ways, lut_ways, hidden_in_lanes=True), [prompt],
               name=f"engine_hidden_{shape_id(shape)}", seed=seed)


@pytest.mark.slow
def test_largest_shape():
    """d_model 64, d_ff 256, vocab 256, seq_len 256: the largest shape the engine takes."""
    rng = np.random.default_rng(64)
    model = random_model(rng, 64, 8, 256, 256, 256)
    prompt = rng.integers(0, 256, size=200).tolist()
    run_engine(model, Shape(66, 3), [prompt], name="engine_largest", seed=64)


# layers, (d_model, heads, d_ff, vocab, seq_len), shape, extreme rules
DEEP = [
    (2, (8, 2, 12, 5, 10), Shape(8, 2), False),
    (3, (16, 2, 24, 12, 12), Shape(18, 3, 1), False),
    (4, (8, 1, 8, 8, 8), Shape(4, 2), True),
    (2, (32, 4, 48, 20, 16), Shape(32, 4, 1, attention_rows=4), False),
    (3, (16, 4, 16, 16, 10), Shape(8, 1, attention_rows=1), True),
]


def deep_id(case):
    layers, dims, shape, extreme = case
    return "L{}_d{}h{}f{}v{}c{}".format(layers, *dims) + f"_p{shape.lanes}w{shape.ways}" + ("_x" if extreme else "")


@pytest.mark.parametrize("case", DEEP, ids=deep_id)
def test_deep_models(case, capsys):
    """L layers a step, each with its own matrices, rules and cache rows, the residual stream
    carried from one into the next: every intermediate of every layer of every step, to the end
    of the context, the golden model's (a prompt's tokens but its last are prefill steps, which
    run every layer but the last whole). The run shows its steps done as it goes."""
    layers, dims, shape, extreme = case
    seed = 10 * layers + dims[0]
    rng = np.random.default_rng(seed)
    model = random_model(rng, *dims, extreme=extreme, n_layers=layers)
    prompt = rng.integers(0, dims[3], size=int(rng.integers(2, dims[4] // 2 + 1))).tolist()
    _, report = run_engine(model, shape, [prompt], name=f"engine_deep_{deep_id(case)}", seed=seed, report=True,
                           progress="deep model")
    assert_dataflow_in_order(make_plan(model, shape.resolved(model)), json.loads(report.read_text()))
    shown = capsys.readouterr().err.splitlines()
    assert shown[0].endswith(f"] deep model: 0 / {model.seq_len} steps")
    assert shown[-1].endswith(f"] deep model: {model.seq_len} / {model.seq_len} steps")


def assert_dataflow_in_order(plan, report):
    """Each generated step's timeline (sim.cycles --timeline) follows the step's dataflow: every
    intermediate leaves its unit after the one it is made of starts to, and within the step,
    which takes at least the cycles the lanes issue words in."""
    model = plan.model
    cycles = dict(report["cycles"])
    assert min(cycles.values()) >= plan.lane_words
    chain = [(name, layer) for layer in range(model.n_layers) for name in ("xi", "q", "ci", "hi", "fi")] + \
        [("oi", None), ("logits", None)]
    assert report["timelines"] and set(map(int, report["timelines"])) == set(cycles)
    for pos, timeline in report["timelines"].items():
        spans = {(name, layer): (first, last) for name, layer, first, last in timeline}
        assert set(spans) == {*chain, *((name, layer) for layer in range(model.n_layers) for name in ("k", "v"))}
        firsts = [spans[key][0] for key in chain]
        assert 0 < firsts[0] and firsts == sorted(set(firsts)), (pos, list(zip(chain, firsts)))
        assert all(first <= last <= cycles[int(pos)] for first, last in spans.values()), (pos, spans)


@pytest.mark.slow
def test_deep_model_d64_dff256():
    """Four layers of d_model 64 and d_ff 256, as the 85F's build shapes them, to the end of a
    context of 24."""
    rng = np.random.default_rng(464)
    model = random_model(rng, 64, 4, 256, 40, 24, n_layers=4)
    plan = choose_plan(model, "85F")
    run_engine(model, plan.shape, [rng.integers(0, 40, size=5).tolist()], name="engine_deep_d64", seed=464)


def test_deep_bad_input():
    model = random_model(np.random.default_rng(4), 16, 2, 24, 12, 8, n_layers=2)
    run_engine(model, Shape(8, 2), [], name="engine_deep_bad_input", testcase="bad_input_is_reported_and_harmless")


def test_a_deep_model_takes_no_qkv_table_and_keeps_no_hidden_vector_in_the_lanes():
    """Above the first layer, q, k and v depend on more than the token and the position."""
    model = random_model(np.random.default_rng(5), 16, 2, 16, 12, 8, n_layers=2)
    assert make_plan(model).qkv.source == "computed"
    with pytest.raises(FitError, match="one-layer"):
        make_plan(model, Shape(qkv_table=True))
    with pytest.raises(FitError, match="one-layer"):
        make_plan(model, Shape(16, 2, hidden_in_lanes=True))
