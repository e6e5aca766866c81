import copy
import json

import numpy as np
import pytest

from int8model import ModelError, load, loads
from int8model.format import LAYER_REQUANTS, LAYER_WEIGHTS, from_json
from int8model.synthetic import random_model

SHIPPED = "models/zen32.json"


@pytest.fixture(scope="module")
def doc():
    return random_model(np.random.default_rng(0), 8, 2, 12, 6, 5).to_json()


def refuse(doc, change, message):
    bad = copy.deepcopy(doc)
    change(bad)
    with pytest.raises(ModelError, match=message):
        from_json(bad)


def test_valid_model_loads_with_its_shape(doc):
    model = from_json(doc)
    assert model.shape == {"d_model": 8, "n_heads": 2, "d_ff": 12, "vocab": 6, "seq_len": 5}
    assert model.weights["W1"].shape == (8, 12)
    assert model.weights["W2"].shape == (12, 8)
    assert model.weights["Eq"].shape == (6, 8)
    assert model.positions.shape == (5, 8)


@pytest.mark.parametrize("section", ["config", "requant", "weights_int8", "embed_stream", "exp_lut"])
def test_missing_section(doc, section):
    refuse(doc, lambda d: d.pop(section), f"missing key '{section}'")


@pytest.mark.parametrize("path", ["config.d_model", "config.seq_len", "requant.M_score",
                                  "weights_int8.W2", "embed_stream.PinA"])
def test_missing_key(doc, path):
    section, key = path.split(".")
    refuse(doc, lambda d: d[section].pop(key), f"missing key '{path}'")


def test_wrong_array_length(doc):
    refuse(doc, lambda d: d["weights_int8"]["Wo"].pop(), r"weights_int8.Wo holds 63 values, expected 64")
    refuse(doc, lambda d: d["embed_stream"]["EinA"].append(1), r"EinA holds 49 values, expected 48")


@pytest.mark.parametrize("value", [1.5, "3", None, True, [1]])
def test_non_integer_value(doc, value):
    def change(d):
        d["weights_int8"]["Wq"][3] = value
    refuse(doc, change, r"weights_int8.Wq\[3\] is .*, not an integer")


@pytest.mark.parametrize("value", [128, -129, 1000])
def test_int8_weight_out_of_range(doc, value):
    def change(d):
        d["weights_int8"]["W1"][5] = value
    refuse(doc, change, rf"weights_int8.W1\[5\] is {value}, outside the int8 range")


def test_heads_must_divide_d_model(doc):
    refuse(doc, lambda d: d["config"].update(n_heads=3), "n_heads 3 does not divide config.d_model 8")


@pytest.mark.parametrize("shift", [-1, 64, 100])
def test_shift_outside_range(doc, shift):
    refuse(doc, lambda d: d["requant"].update(r_ctx=[1, shift]), rf"requant.r_ctx's shift {shift} is outside 0..63")


def test_requant_not_a_pair(doc):
    refuse(doc, lambda d: d["requant"].update(M_q=[1, 2, 3]), r"requant.M_q must be an \[M, S\] pair")
    refuse(doc, lambda d: d["requant"].update(M_q=[0.5, 2]), r"requant.M_q's multiplier 0.5 is not an integer")


def test_exp_lut(doc):
    refuse(doc, lambda d: d.update(exp_lut=[]), "exp_lut is empty")
    refuse(doc, lambda d: d.update(exp_lut=[0, 5]), r"exp_lut\[0\] is 0; it must be > 0")
    refuse(doc, lambda d: d.update(exp_lut=[-3]), r"exp_lut\[0\] is -3")
    refuse(doc, lambda d: d.update(exp_lut=[9, -1]), r"exp_lut\[1\] is -1")


@pytest.mark.parametrize("key", ["d_model", "n_heads", "d_ff", "vocab", "seq_len"])
def test_size_of_zero(doc, key):
    refuse(doc, lambda d: d["config"].update({key: 0}), rf"config.{key} is 0, not a positive integer")


def test_vocab_over_256(doc):
    refuse(doc, lambda d: d["config"].update(vocab=257), "config.vocab is 257; a token travels as one byte")


def test_not_json_and_not_an_object():
    with pytest.raises(ModelError, match="not JSON"):
        loads("{config:")
    with pytest.raises(ModelError, match="JSON object, not list"):
        loads("[1, 2]")


def test_unreadable_file(tmp_path):
    with pytest.raises(ModelError, match="cannot read"):
        load(tmp_path / "absent.json")


def test_extra_keys_are_kept_and_do_not_change_identity(doc):
    model = from_json(doc)
    extended = dict(doc, tokenizer={"kind": "chars", "chars": "abcdef"}, metadata={"note": "x"})
    other = from_json(extended)
    assert other.extra == {"tokenizer": {"kind": "chars", "chars": "abcdef"}, "metadata": {"note": "x"}}
    assert other.to_json()["metadata"] == {"note": "x"}
    assert other.sha256 == model.sha256


def test_identity_ignores_key_order_and_whitespace(doc):
    model = from_json(doc)
    reordered = {k: doc[k] for k in reversed(list(doc))}
    reordered["config"] = {k: doc["config"][k] for k in reversed(list(doc["config"]))}
    text = json.dumps(reordered, indent=7)
    assert loads(text).sha256 == model.sha256
    assert model.identity_line == f"model sha256 {model.sha256}"
    assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0


def test_identity_changes_with_any_semantic_value(doc):
    base = from_json(doc).sha256
    for change in (lambda d: d["weights_int8"]["Wv"].__setitem__(0, d["weights_int8"]["Wv"][0] ^ 1),
                   lambda d: d["requant"]["M_h"].__setitem__(1, (d["requant"]["M_h"][1] + 1) % 64),
                   lambda d: d["exp_lut"].append(1),
                   lambda d: d["embed_stream"]["PinA"].__setitem__(0, d["embed_stream"]["PinA"][0] + 1)):
        changed = copy.deepcopy(doc)
        change(changed)
        assert from_json(changed).sha256 != base


def test_nothing_half_loaded(tmp_path, doc):
    bad = copy.deepcopy(doc)
    bad["exp_lut"] = []
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ModelError, match=f"{path}: exp_lut is empty"):
        load(path)


def test_shipped_model_round_trips(tmp_path):
    model = load(SHIPPED)
    assert model.shape == {"d_model": 32, "n_heads": 4, "d_ff": 32, "vocab": 32, "seq_len": 32}
    model.save(tmp_path / "copy.json")
    copy_ = load(tmp_path / "copy.json")
    assert copy_.sha256 == model.sha256
    assert copy_.tokenizer == model.tokenizer


@pytest.fixture(scope="module")
def deep_doc():
    return random_model(np.random.default_rng(8), 8, 2, 12, 6, 5, n_layers=3).to_json()


def test_a_deep_model_has_its_layers(deep_doc):
    model = from_json(deep_doc)
    assert model.n_layers == 3 and model.shape["n_layers"] == 3
    assert [layer.weights["W1"].shape for layer in model.layers] == [(8, 12)] * 3
    assert model.layers[2].requant["M_q"] == tuple(deep_doc["requant"]["M_q"][2])
    assert model.head.shape == (6, 8) and model.r_out == tuple(deep_doc["requant"]["r_out"])
    with pytest.raises(ModelError, match="by layer"):
        model.requant  # a deep model's pairs are its layers'
    assert from_json(json.loads(json.dumps(model.to_json()))).sha256 == model.sha256


def test_a_one_layer_model_is_the_same_in_either_spelling(doc):
    """With ``n_layers`` 1 and a list of one for each per-layer key, or in the seed's spelling:
    the same model, the same identity; the shipped model's identity is the one it always had."""
    deep = copy.deepcopy(doc)
    deep["config"]["n_layers"] = 1
    for key in LAYER_REQUANTS:
        deep["requant"][key] = [deep["requant"][key]]
    for key in LAYER_WEIGHTS:
        deep["weights_int8"][key] = [deep["weights_int8"][key]]
    assert from_json(deep).sha256 == from_json(doc).sha256
    assert from_json(deep).to_json() == from_json(doc).to_json()
    shipped = load(SHIPPED)
    assert shipped.sha256 == "855441e4e2bf2d0c7cecec56aef205de8b8625c834a68d12d46d5a299e7e7fbc"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["requant"]["M_q"].pop(), r"requant.M_q holds 2 \[M, S\] pairs, expected 3 \(config.n_layers is 3\)"),
    (lambda d: d["requant"].__setitem__("M_k", [3, 4]), r"requant.M_k must be a list of 3 \[M, S\] pairs, one per layer"),
    (lambda d: d["weights_int8"]["W1"][2].__setitem__(17, 300),
     r"weights_int8.W1\[layer 2\]\[17\] is 300, outside the int8 range"),
    (lambda d: d["weights_int8"].__setitem__("Wo", d["weights_int8"]["Wo"][0]),
     "weights_int8.Wo must be a list of 3 arrays, one per layer"),
    (lambda d: d["weights_int8"]["W2"][1].pop(), r"weights_int8.W2\[layer 1\] holds 95 values, expected 96"),
    (lambda d: d["requant"]["r_hid"][1].__setitem__(1, 64), r"requant.r_hid\[layer 1\]'s shift 64 is outside 0..63"),
    (lambda d: d["config"].__setitem__("n_layers", 0), "config.n_layers is 0, not a positive integer"),
    (lambda d: d["config"].__setitem__("n_layers", 2), r"holds 3 .*, expected 2 \(config.n_layers is 2\)"),
])
def test_bad_deep_files_name_the_key_and_the_layer(deep_doc, change, message):
    refuse(deep_doc, change, message)
