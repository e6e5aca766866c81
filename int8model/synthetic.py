"""Random models of any shape, for tests and benchmarks.

Requant pairs are picked so that activations spread over the int8 range rather than all
saturating or all vanishing; ``extreme=True`` instead draws from the edges the format allows
(shifts 0 and 63, huge and negative multipliers, tiny exp tables) while staying inside the
64-bit bounds.
"""

import numpy as np

from .bounds import BoundsError, analyse
from .format import REQUANTS, from_json

__all__ = ["random_model"]


def _pair(rng, gain):
    """A requant (M, S) whose ratio M / 2**S is about ``gain``."""
    shift = int(rng.integers(8, 20))
    multiplier = max(1, int(round(gain * 2**shift * rng.uniform(0.5, 1.5))))
    return [multiplier, shift]


def _extreme_pair(rng):
    choice = rng.integers(6)
    if choice == 0:
        return [int(rng.integers(-4, 5)), 0]
    if choice == 1:
        return [int(rng.integers(-2**40, 2**40)), 63]
    if choice == 2:
        return [-int(rng.integers(1, 2**12)), int(rng.integers(0, 16))]
    if choice == 3:
        return [int(rng.integers(2**20, 2**24)), int(rng.integers(0, 8))]
    return _pair(rng, float(rng.choice([1 / 64, 1 / 8, 1, 8])))


def random_model(rng, d_model=32, n_heads=4, d_ff=32, vocab=32, seq_len=32,
                 nlut=None, extreme=False, tries=50, n_layers=1):
    """A random valid model whose intermediates fit ``int64``, as a :class:`Model`; with
    ``n_layers`` above 1, a deep one (each layer's pairs and matrices drawn alike)."""
    for _ in range(tries):
        doc = _random_doc(rng, d_model, n_heads, d_ff, vocab, seq_len, nlut, extreme, n_layers)
        model = from_json(doc)
        try:
            analyse(model)
        except BoundsError:
            continue
        return model
    raise RuntimeError("no random model within the 64-bit bounds; loosen the extremes")


def _random_doc(rng, d, heads, d_ff, vocab, seq_len, nlut, extreme, n_layers=1):
    def int8(rows, cols):
        if extreme and rng.random() < 0.3:
            return rng.choice([-128, 127, 0], size=rows * cols).tolist()
        return rng.integers(-128, 128, size=rows * cols).tolist()

    embed_scale = int(rng.choice([1 << 8, 1 << 12, 1 << 16]))
    # Gains bring each accumulator (about 128 · 64 · sqrt(n) in size) back to int8.
    gains = {
        "r_qkv": 96 / embed_scale, "r_ffn": 96 / embed_scale, "r_out": 96 / embed_scale,
        "r_ctx": 1.0, "r_hid": 1.0,
        "M_q": 2.0 / np.sqrt(d) / 64, "M_k": 2.0 / np.sqrt(d) / 64, "M_v": 2.0 / np.sqrt(d) / 64,
        "M_o": embed_scale / 64 / np.sqrt(d) / 64, "M_f": embed_scale / 64 / np.sqrt(d_ff) / 64,
        "M_h": 2.0 / np.sqrt(d) / 64, "M_score": 1 / 256,
    }
    def pair(key):
        return _extreme_pair(rng) if extreme and rng.random() < 0.4 else _pair(rng, gains[key])

    def per_layer(make, key):
        return make(key) if n_layers == 1 or key in ("r_out", "Eq") else [make(key) for _ in range(n_layers)]
    requant = {key: per_layer(pair, key) for key in REQUANTS}
    if nlut is None:
        nlut = int(rng.choice([1, 2, 8, 32, 64])) if extreme else int(rng.choice([16, 32, 64]))
    decay = rng.uniform(0.05, 0.5)
    lut = [max(1, int(round(2**14 * np.exp(-decay * i)))) for i in range(nlut)]
    if extreme and rng.random() < 0.5:
        lut = [int(rng.integers(1, 2**20))] + [int(rng.integers(0, 2**20)) for _ in range(nlut - 1)]
    return {
        "config": {"d_model": d, "n_heads": heads, "d_ff": d_ff, "vocab": vocab, "seq_len": seq_len,
                   **({"n_layers": n_layers} if n_layers > 1 else {})},
        "requant": requant,
        "weights_int8": {key: per_layer(lambda _: int8(*shape), key) for key, shape in (
            ("Wq", (d, d)), ("Wk", (d, d)), ("Wv", (d, d)), ("Wo", (d, d)),
            ("W1", (d, d_ff)), ("W2", (d_ff, d)), ("Eq", (vocab, d)))},
        "embed_stream": {
            "EinA": rng.integers(-embed_scale, embed_scale, size=vocab * d).tolist(),
            "PinA": rng.integers(-embed_scale // 4, embed_scale // 4, size=seq_len * d).tolist(),
        },
        "exp_lut": lut,
    }
