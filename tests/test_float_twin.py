"""The deep demo model's float twin and its quantisation (in NumPy: no training needed)."""

import numpy as np

from int8model import Golden
from int8model.corpus import HELD_OUT_EVERY, kjv
from int8model.float_twin import float_figures, forward, init_params, int8_figures, int8_model, quantise, windows
from int8model.train import Tokenizer

BIBLE = """
Genesis 1

  1 In the beginning God created the heaven and the earth.
  2 And the earth was without form, and void; and darkness was upon the face of
the deep.

Genesis 20

  1 And Abraham journeyed from thence toward the south country.

Exodus 3

  7 And the LORD said, I have surely seen the affliction of my people.
"""


def test_the_held_out_chapters_are_never_trained_on():
    """Verses joined across wrapped lines, lowercased, one a line; a chapter whose number is a
    multiple of HELD_OUT_EVERY goes to the held-out text whole."""
    corpus = kjv(BIBLE)
    assert HELD_OUT_EVERY == 20
    assert corpus.train == ("in the beginning god created the heaven and the earth.\n"
                            "and the earth was without form, and void; and darkness was upon the face of the deep.\n"
                            "and the lord said, i have surely seen the affliction of my people.\n")
    assert corpus.held_out == "and abraham journeyed from thence toward the south country.\n"


def test_a_quantised_deep_model_decides_as_its_float_twin():
    """Random float parameters of three layers, quantised with scales calibrated on random text:
    the int8 model (run by the golden model) picks the float model's next token at most
    positions, and its bits per character (its logits times the file's scale) are close."""
    rng = np.random.default_rng(4)
    config = dict(layers=3, d_model=32, n_heads=4, d_ff=48, vocab=20, seq_len=24)
    params = init_params(rng, **config)
    params = {**params, "E": params["E"] * 4}  # logits spread enough to have a clear arg-max
    tokenizer = Tokenizer("abcdefghijklmnopqrst")
    ids = rng.integers(0, 20, size=2000).tolist()
    calibration = [x for x, _ in windows(ids[:24 * 40], 24)]
    doc = quantise(params, config["n_heads"], calibration, tokenizer)
    model = int8_model(doc)
    assert model.n_layers == 3 and model.tokenizer == tokenizer.chars
    held_out = ids[1000:1480]
    agree = total = 0
    for x, _ in windows(held_out, 24):
        golden = Golden(model)
        want = forward(params, x[None], config["n_heads"])[0].argmax(axis=-1)
        got = [golden.step(int(tok)).next for tok in x]
        agree += int((np.array(got) == want).sum())
        total += len(x)
    assert agree / total > 0.8
    floats, ints = float_figures(params, 4, held_out, 24), int8_figures(model, held_out, doc["logit_scale"])
    assert floats["characters"] == ints["characters"] == len(held_out) - 1
    assert abs(floats["bits_per_char"] - ints["bits_per_char"]) < 0.1 * floats["bits_per_char"]
