"""A loadable build's limits: what they admit stays within the bounds the plan sizes for, and
what they refuse is named."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from int8model import analyse, load, loads
from int8model.synthetic import random_model
from plan.limits import LimitError, Limits, check_limits, envelope, limits_for

SHAPE = dict(d_model=16, n_heads=2, d_ff=32, vocab=16, seq_len=16)


def within(inner, outer):
    return outer.lo <= inner.lo and inner.hi <= outer.hi


# Limits wide enough for the random models of int8model.synthetic, which draw embeddings of up
# to 17 bits and multipliers of up to 21 (trained models need 16 of each).
WIDE_LIMITS = dict(embedding_bits=18, multiplier_bits=22)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), extreme=st.booleans(), layers=st.sampled_from([1, 2, 3]),
       widths=st.fixed_dictionaries({
           "multiplier_bits": st.integers(12, 26), "embedding_bits": st.integers(12, 20),
           "residual_bits": st.integers(16, 32), "hidden_bits": st.integers(16, 32),
           "exp_bits": st.integers(12, 22), "max_nlut": st.integers(16, 128)}))
def test_every_model_within_the_limits_stays_within_the_envelope(seed, extreme, layers, widths):
    """Any model the limits admit: every intermediate of every layer, as its own bound analysis
    finds it, lies within the envelope the loadable plan is sized for."""
    model = random_model(np.random.default_rng(seed), **SHAPE, extreme=extreme, n_layers=layers)
    limits = Limits(**SHAPE, n_layers=layers, **widths)
    try:
        check_limits(model, limits)
    except LimitError:
        event("refused")
        return
    event("admitted")
    layer_envelope, top_envelope = envelope(limits)
    bounds = analyse(model)
    for index, layer in enumerate(bounds.layers):
        assert set(layer) == set(layer_envelope[index])
        for name, bound in layer.items():
            assert within(bound, layer_envelope[index][name]), (index, name, bound, layer_envelope[index][name])
    top = {name: bound for name, bound in bounds.items() if name in top_envelope}
    assert set(top) == set(top_envelope)
    for name, bound in top.items():
        assert within(bound, top_envelope[name]), (name, bound)


def test_wide_limits_take_every_ordinary_random_model_and_refuse_most_extreme_ones():
    """The property above is not vacuous: limits admit ordinary models, and refuse extreme ones
    for what they are."""
    admitted = {False: 0, True: 0}
    for seed in range(40):
        extreme = seed % 2 == 1
        model = random_model(np.random.default_rng(seed), **SHAPE, extreme=extreme, n_layers=1 + seed % 3)
        try:
            check_limits(model, Limits(**SHAPE, n_layers=model.n_layers, **WIDE_LIMITS))
            admitted[extreme] += 1
        except LimitError as error:
            assert str(error).startswith(("requant.", "exp_lut[", "embed_stream.", "x ", "o ", "s1 ", "f ", "s2 ",
                                          "hid ")), error
    assert admitted[False] == 20 and admitted[True] < 10


@pytest.mark.parametrize("path", ["models/zen32.json", "models/kjv4.json"])
def test_a_build_for_a_model_takes_that_model(path):
    model = load(path)
    limits = limits_for(model)
    check_limits(model, limits)
    assert limits == dataclasses.replace(Limits(**model.shape), max_nlut=max(128, model.nlut))


def test_the_limits_widen_for_a_model_that_needs_more():
    model = random_model(np.random.default_rng(5), **SHAPE, extreme=True, tries=200)
    limits = limits_for(model)
    check_limits(model, limits)
    assert limits.multiplier_bits >= 18 and limits.residual_bits >= 24


def edited(model, edit):
    doc = model.to_json()
    edit(doc)
    return loads(json.dumps(doc))


@pytest.fixture(scope="module")
def deep():
    return load("models/kjv4.json")


def refusal(model, limits):
    with pytest.raises(LimitError) as error:
        check_limits(model, limits)
    return str(error.value)


def test_another_shape_is_refused_naming_the_field(deep):
    limits = dataclasses.replace(limits_for(deep), d_ff=256)
    assert refusal(deep, limits) == "config.d_ff is 128; this build's shape has 256"
    assert "config.n_layers is 4" in refusal(deep, dataclasses.replace(limits_for(deep), n_layers=2))


def test_a_multiplier_too_wide_is_refused_naming_the_key_and_layer(deep):
    limits = limits_for(deep)
    def widen(doc):
        doc["requant"]["M_o"][2] = [1 << 17, 40]
    message = refusal(edited(deep, widen), limits)
    assert message.startswith("requant.M_o of layer 2 has multiplier 131072, 19 bits") and "18-bit" in message


def test_an_exp_entry_or_embedding_too_wide_is_refused(deep):
    limits = limits_for(deep)
    def exp(doc):
        doc["exp_lut"][3] = 1 << 16
    assert refusal(edited(deep, exp), limits).startswith("exp_lut[3] is 65536; this build's entries are 16-bit")
    def embedding(doc):
        doc["embed_stream"]["PinA"][7] = -(1 << 15) - 1
    assert refusal(edited(deep, embedding), limits).startswith("embed_stream.PinA reaches")


def test_a_residual_stream_too_wide_is_refused_naming_the_layer(deep):
    """A larger M_f in layer 1 takes that layer's f past the residual stream's width."""
    limits = limits_for(deep)
    def louder(doc):
        multiplier, shift = doc["requant"]["M_f"][1]
        doc["requant"]["M_f"][1] = [multiplier, max(0, shift - 10)]
    message = refusal(edited(deep, louder), limits)
    assert message.startswith("f in layer 1 can reach") and "residual stream is 24-bit" in message


def test_a_corner_model_reaches_the_envelope():
    """Every weight -128, embeddings at both ends of their width, unit requant pairs and the
    exp table's extremes: this model's own bounds lie within the envelope, and reach it for
    each intermediate its shape alone decides (so that the envelope is not loose there)."""
    limits = Limits(**SHAPE, n_layers=2)
    model = random_model(np.random.default_rng(0), **SHAPE, n_layers=2)
    doc = model.to_json()
    for key, pairs in doc["requant"].items():
        doc["requant"][key] = [[1, 0] for _ in pairs] if key != "r_out" else [1, 0]
    for key, matrices in doc["weights_int8"].items():
        doc["weights_int8"][key] = [[-128] * len(matrix) for matrix in matrices] if key != "Eq" \
            else [-128] * len(matrices)
    top = 1 << (limits.embedding_bits - 1)
    for key, values in doc["embed_stream"].items():
        doc["embed_stream"][key] = [-top if n % 2 else top - 1 for n in range(len(values))]
    doc["exp_lut"] = [1, (1 << limits.exp_bits) - 1] + [0] * (limits.max_nlut - 2)
    corner = loads(json.dumps(doc))
    check_limits(corner, limits)
    layer_envelope, top_envelope = envelope(limits)
    bounds = analyse(corner)
    tight = {"xi", "acc_q", "acc_k", "acc_v", "q", "k", "v", "scores", "score_gap", "lut_index", "weights",
             "num", "ctx", "ci", "acc_o", "hi", "acc_h"}
    for index, layer in enumerate(bounds.layers):
        for name, bound in layer.items():
            assert within(bound, layer_envelope[index][name]), (index, name, bound)
            assert name not in tight or bound == layer_envelope[index][name], (index, name, bound)
    for name in ("oi", "logits"):
        assert bounds[name] == top_envelope[name], name


def test_a_hidden_value_too_wide_is_refused_naming_the_layer(deep):
    """A smaller shift of M_h in layer 3 widens only that layer's hid: r_hid clamps it after."""
    def louder(doc):
        multiplier, shift = doc["requant"]["M_h"][3]
        doc["requant"]["M_h"][3] = [multiplier, max(0, shift - 10)]
    message = refusal(edited(deep, louder), limits_for(deep))
    assert message.startswith("hid in layer 3 can reach") and "FFN's hidden value is 24-bit" in message
