import numpy as np
import pytest

from int8model import BoundsError, DecodeError, Golden, analyse
from int8model.format import from_json
from int8model.synthetic import random_model

from .reference import Reference

SHAPES = [(8, 1, 8, 8, 8), (8, 2, 12, 5, 10), (16, 4, 24, 20, 12), (32, 4, 32, 32, 32),
          (12, 3, 7, 3, 6), (64, 8, 48, 40, 8)]


def run_both(model, prompt):
    golden = Golden(model)
    reference = Reference(model.to_json())
    for pos, tok in enumerate(prompt):
        trace = golden.step(tok)
        logits, best = reference.step(tok, pos)
        assert trace.logits.tolist() == logits, f"logits differ at position {pos}"
        assert trace.next == best, f"next differs at position {pos}"
    return reference.events


@pytest.mark.parametrize("extreme", [False, True])
def test_golden_matches_reference_on_random_models(extreme):
    rng = np.random.default_rng(1234 + extreme)
    events = set()
    for i in range(120):
        d, h, dff, vocab, seq_len = SHAPES[i % len(SHAPES)]
        model = random_model(rng, d, h, dff, vocab, seq_len, extreme=extreme)
        prompt = rng.integers(0, vocab, size=int(rng.integers(1, seq_len + 1))).tolist()
        events |= run_both(model, prompt)
    # The comparison is only as good as the corners it reached.
    expected = {"saturate_high", "saturate_low", "negative_inexact_division"}
    if extreme:
        expected |= {"lut_beyond_end"}
    assert expected <= events


def tie_model():
    """A model whose head rows repeat, so the arg-max must break ties to the lowest id."""
    rng = np.random.default_rng(7)
    doc = random_model(rng, 8, 2, 8, 6, 8).to_json()
    eq = doc["weights_int8"]["Eq"]
    doc["weights_int8"]["Eq"] = eq[:8] * 6  # every token's row is the same: all logits tie
    return from_json(doc)


def test_argmax_ties_go_to_lowest_token():
    model = tie_model()
    events = run_both(model, [1, 2, 3, 4])
    assert "argmax_tie" in events
    assert [t.next for t in Golden(model).generate([5], 4)] == [0, 0, 0, 0]


def test_lut_index_beyond_table_is_clamped():
    rng = np.random.default_rng(3)
    doc = random_model(rng, 8, 2, 8, 8, 8).to_json()
    doc["exp_lut"] = [100, 10]
    doc["requant"]["M_score"] = [1, 0]  # gaps of thousands index far past the two entries
    model = from_json(doc)
    events = run_both(model, [0, 1, 2, 3, 4, 5])
    assert "lut_beyond_end" in events


def test_refuses_model_that_could_overflow_int64():
    rng = np.random.default_rng(5)
    doc = random_model(rng, 8, 2, 8, 8, 8).to_json()
    doc["requant"]["M_o"] = [2**62, 0]
    with pytest.raises(BoundsError, match="acc_o"):
        Golden(from_json(doc))


def test_bounds_cover_what_the_model_reaches():
    rng = np.random.default_rng(11)
    for _ in range(10):
        model = random_model(rng, 16, 2, 16, 16, 16)
        bounds = analyse(model)
        golden = Golden(model)
        for trace in golden.generate(rng.integers(0, 16, size=4).tolist(), 13):
            for name in ("x", "xi", "q", "k", "v", "scores", "lut_index", "weights", "den", "num",
                         "ctx", "ci", "s1", "hi", "hid", "fi", "s2", "oi", "logits"):
                value = getattr(trace, name)
                assert bounds[name].lo <= value.min() and value.max() <= bounds[name].hi, name


def test_token_outside_vocab_is_refused():
    model = random_model(np.random.default_rng(0), 8, 2, 8, 8, 8)
    golden = Golden(model)
    with pytest.raises(DecodeError, match="token 8 is outside the vocab 0..7"):
        golden.step(8)
    with pytest.raises(DecodeError, match="token -1"):
        golden.step(-1)
    assert golden.pos == 0


def test_position_past_cache_is_refused_not_wrapped():
    model = random_model(np.random.default_rng(0), 8, 2, 8, 8, 4)
    golden = Golden(model)
    for _ in range(4):
        golden.step(1)
    with pytest.raises(DecodeError, match="position 4 is past the cache"):
        golden.step(1)
    with pytest.raises(DecodeError, match="need 5 positions"):
        list(golden.generate([1, 2], 4))


def test_reset_forgets_previous_sequence():
    model = random_model(np.random.default_rng(2), 8, 2, 8, 8, 8)
    golden = Golden(model)
    first = [t.next for t in golden.generate([1, 2, 3], 5)]
    list(golden.generate([7, 6, 5, 4], 5))
    assert [t.next for t in golden.generate([1, 2, 3], 5)] == first


@pytest.mark.parametrize("n_layers, shape", [(2, (8, 2, 12, 5, 10)), (3, (16, 4, 24, 20, 12)), (4, (8, 1, 8, 8, 8))])
@pytest.mark.parametrize("extreme", [False, True])
def test_deep_models_match_the_reference(n_layers, shape, extreme):
    """L layers of the same step, each with its own pairs, matrices and cache, the residual
    stream carried on between them unclamped: the golden model against the reference's reading
    of the deep file, layer by layer."""
    rng = np.random.default_rng(100 * n_layers + extreme)
    for _ in range(6):
        model = random_model(rng, *shape, extreme=extreme, n_layers=n_layers)
        assert model.n_layers == n_layers
        prompt = rng.integers(0, shape[3], size=int(rng.integers(1, shape[4] + 1))).tolist()
        run_both(model, prompt)


def test_a_deep_trace_gives_every_layers_intermediates():
    model = random_model(np.random.default_rng(5), 8, 2, 12, 5, 10, n_layers=3)
    golden = Golden(model)
    first, second = golden.step(1), golden.step(2)
    assert len(second.layers) == 3
    for below, above in zip(second.layers, second.layers[1:]):
        assert above.x.tolist() == below.s2.tolist()  # the residual stream, unclamped
    assert second.layers[0].x.tolist() == (model.embed[2] + model.positions[1]).tolist()
    # Each layer has its own cache: its rows are its own k and v.
    assert golden.keys[1, 0].tolist() == first.layers[1].k.tolist()
    assert golden.values[2, 1].tolist() == second.layers[2].v.tolist()
    with pytest.raises(AttributeError):
        second.q  # a deep trace's names are its layers'
