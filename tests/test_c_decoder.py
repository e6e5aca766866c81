"""The C baseline decodes exactly as the golden model does, or its timings would mean nothing."""

import numpy as np
import pytest

from bench.c_decoder import CDecoder
from int8model import Golden, load
from int8model.synthetic import random_model


def check(model, prompt, qkv_table=False):
    decoder = CDecoder(model, qkv_table=qkv_table)
    try:
        tokens, ns = decoder.run(prompt)
    finally:
        decoder.close()
    count = model.seq_len - len(prompt) + 1
    assert tokens == [t.next for t in Golden(model).generate(prompt, count)]
    assert ns > 0


@pytest.mark.parametrize("qkv_table", [False, True], ids=["computed", "qkv_table"])
def test_shipped_model(qkv_table):
    check(load("models/zen32.json"), [3, 1, 4], qkv_table)


@pytest.mark.parametrize("seed", range(6))
def test_random_models(seed):
    rng = np.random.default_rng(seed)
    shape = [(8, 2, 12, 5, 8), (16, 4, 24, 40, 16), (32, 4, 32, 32, 32), (64, 8, 96, 50, 16),
             (24, 3, 16, 7, 12), (16, 1, 8, 256, 10)][seed]
    model = random_model(rng, *shape, extreme=seed % 2 == 1)
    check(model, rng.integers(0, shape[3], size=3).tolist(), qkv_table=seed % 3 == 0)


@pytest.mark.parametrize("layers, shape", [(2, (8, 2, 12, 5, 8)), (4, (16, 4, 24, 40, 16)), (3, (24, 3, 16, 7, 12))])
def test_deep_models(layers, shape):
    rng = np.random.default_rng(layers)
    model = random_model(rng, *shape, extreme=layers % 2 == 1, n_layers=layers)
    check(model, rng.integers(0, shape[3], size=3).tolist())
