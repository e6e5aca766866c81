"""The demo model's training: its gradients, and the accuracy of what it exports."""

import numpy as np
import pytest

from int8model import Golden, load
from int8model.format import from_json
from int8model.train import (FloatModel, Tokenizer, accuracy_float, accuracy_int8, corpus,
                             quantise, train)


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    model = FloatModel(rng, 8, 2, 12, 5, 6)
    tokens, targets = rng.integers(5, size=(3, 6)), rng.integers(5, size=(3, 6))
    _, grads = model.loss_and_grads(tokens, targets)
    for name in FloatModel.NAMES:
        param = model.params[name]
        for _ in range(3):
            index = tuple(int(rng.integers(n)) for n in param.shape)
            old = param[index]
            param[index] = old + 1e-6
            up, _ = model.loss_and_grads(tokens, targets)
            param[index] = old - 1e-6
            down, _ = model.loss_and_grads(tokens, targets)
            param[index] = old
            assert (up - down) / 2e-6 == pytest.approx(grads[name][index], rel=1e-4, abs=1e-9), name


def test_shipped_model_int8_accuracy():
    model = load("models/zen32.json")
    text = corpus()
    ids = Tokenizer(model.tokenizer).encode(text)
    assert accuracy_int8(model, ids) >= 0.60


@pytest.mark.slow
def test_training_reaches_targets():
    text = corpus()
    tokenizer = Tokenizer.for_text(text)
    assert len(tokenizer.chars) <= 32
    model = train(text, tokenizer, steps=2000, seed=1)
    int_model = from_json(quantise(model, text, tokenizer))
    ids = tokenizer.encode(text)
    float_accuracy, int8_accuracy = accuracy_float(model, ids), accuracy_int8(int_model, ids)
    assert int8_accuracy >= 0.60
    assert float_accuracy - int8_accuracy <= 0.05
    Golden(int_model)  # the exported model passes the 64-bit bound analysis
