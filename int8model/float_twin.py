"""The float twin of a deep int8 model: its forward pass, its quantisation into a model file, and
the figures a model is judged by.

The float model has the int8 model's architecture exactly (no normalisation; a residual stream
through L layers of LUT-friendly softmax attention and a ReLU FFN; the head tied to the token
embedding), so quantisation only has to pick scales: per-tensor weight scales, and activation
scales calibrated on text. The forward pass is written once for NumPy and for JAX (``xp``):
training differentiates it, quantisation and evaluation run it in NumPy.
"""

import numpy as np

from .format import LAYER_REQUANTS, from_json
from .golden import Golden
from .train import eval_windows, requant_pair

__all__ = ["LUT_ONE", "LUT_STEPS", "NLUT", "RESIDUAL_UNITS", "init_params", "forward", "quantise",
           "windows", "float_figures", "int8_figures"]

# The softmax's exponential table: weight of a score `gap` below the row's maximum is
# LUT_ONE · exp(−gap), the gap measured in steps of 1/LUT_STEPS.
LUT_ONE = 1 << 12
LUT_STEPS = 16
NLUT = 128
# Residual stream resolution: the largest activation is this many units.
RESIDUAL_UNITS = 1 << 12
LAYER_PARAMS = ("Wq", "Wk", "Wv", "Wo", "W1", "W2")


def init_params(rng, *, layers, d_model, n_heads, d_ff, vocab, seq_len):
    """Random initial parameters (NumPy, float32): the embeddings, a gain on the tied head, and
    each layer's matrices, the ones that write into the residual stream scaled down with depth."""
    def normal(*shape, fan, scale=1.0):
        return (rng.normal(0, scale / np.sqrt(fan), size=shape)).astype(np.float32)
    depth = 1 / np.sqrt(2 * layers)
    return {
        "E": normal(vocab, d_model, fan=1, scale=0.5), "P": normal(seq_len, d_model, fan=1, scale=0.1),
        "log_gain": np.zeros((), np.float32),
        "layers": [{"Wq": normal(d_model, d_model, fan=d_model), "Wk": normal(d_model, d_model, fan=d_model),
                    "Wv": normal(d_model, d_model, fan=d_model),
                    "Wo": normal(d_model, d_model, fan=d_model, scale=depth),
                    "W1": normal(d_model, d_ff, fan=d_model), "W2": normal(d_ff, d_model, fan=d_ff, scale=depth)}
                   for _ in range(layers)],
    }


def forward(params, tokens, n_heads, xp=np, record=None):
    """The logits of a batch of windows ``tokens`` (B × T); with ``record`` (a dict), every
    layer's activations by name (``X``, ``Q``, ``K``, ``V``, ``C``, ``S1``, ``Hr``, then
    ``S2`` of the last), as lists, one entry per layer."""
    b, t = tokens.shape
    x = params["E"][tokens] + params["P"][:t]
    d = x.shape[-1]
    hd = d // n_heads
    causal = xp.tril(xp.ones((t, t), dtype=bool))
    for layer in params["layers"]:
        split = lambda m: m.reshape(b, t, n_heads, hd).transpose(0, 2, 1, 3)
        q, k, v = x @ layer["Wq"], x @ layer["Wk"], x @ layer["Wv"]
        scores = split(q) @ split(k).transpose(0, 1, 3, 2) / np.sqrt(hd)
        scores = xp.where(causal, scores, -xp.inf)
        weights = xp.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = weights / weights.sum(axis=-1, keepdims=True)
        c = (weights @ split(v)).transpose(0, 2, 1, 3).reshape(b, t, d)
        s1 = x + c @ layer["Wo"]
        hr = xp.maximum(s1 @ layer["W1"], 0)
        s2 = s1 + hr @ layer["W2"]
        if record is not None:
            for name, value in (("X", x), ("Q", q), ("K", k), ("V", v), ("C", c), ("S1", s1), ("Hr", hr)):
                record.setdefault(name, []).append(value)
        x = s2
    if record is not None:
        record["S2"] = x
    return xp.exp(params["log_gain"]) * (x @ params["E"].T)


def windows(ids, seq_len):
    """:func:`eval_windows` as arrays."""
    return [(np.array(x), np.array(y)) for x, y in eval_windows(ids, seq_len)]


def quantise(params, n_heads, calibration, tokenizer, peak=None):
    """The int8 model file (as a dict) of the float ``params``, its activation scales calibrated
    on the windows ``calibration`` (token arrays of the context's length): per tensor, the
    largest magnitude the text gives it (or ``peak(values)``)."""
    peak = peak or (lambda values: float(np.abs(values).max()))
    records = []
    for tokens in calibration:
        record = {}
        forward(params, tokens[None], n_heads, record=record)
        records.append(record)
    layers = len(params["layers"])

    def scale(name, layer=None):
        values = [r[name] if layer is None else r[name][layer] for r in records]
        return peak(np.concatenate([v.ravel() for v in values])) / 127

    def weight(matrix):
        s = np.abs(matrix).max() / 127
        return np.clip(np.round(matrix / s), -128, 127).astype(int), s

    residual = max([scale(name, layer) for layer in range(layers) for name in ("X", "S1")] + [scale("S2")])
    s_res = residual * 127 / RESIDUAL_UNITS
    head_dim = params["E"].shape[1] // n_heads
    requant = {key: [] for key in LAYER_REQUANTS}
    matrices = {key: [] for key in LAYER_PARAMS}
    for index, layer in enumerate(params["layers"]):
        s_xi, s_hi = scale("X", index), scale("S1", index)
        s_q, s_k, s_v = scale("Q", index), scale("K", index), scale("V", index)
        s_fi = scale("Hr", index)
        s_hid = s_fi / 8  # hid keeps three more bits than fi; r_hid drops them
        w = {key: weight(layer[key]) for key in LAYER_PARAMS}
        for key in LAYER_PARAMS:
            matrices[key].append(w[key][0].ravel().tolist())
        pairs = {
            "r_qkv": requant_pair(s_res / s_xi), "r_ffn": requant_pair(s_res / s_hi),
            "r_ctx": [1, 0], "r_hid": [1, 3],
            "M_q": requant_pair(s_xi * w["Wq"][1] / s_q), "M_k": requant_pair(s_xi * w["Wk"][1] / s_k),
            "M_v": requant_pair(s_xi * w["Wv"][1] / s_v), "M_o": requant_pair(s_v * w["Wo"][1] / s_res),
            "M_h": requant_pair(s_hi * w["W1"][1] / s_hid), "M_f": requant_pair(s_fi * w["W2"][1] / s_res),
            "M_score": requant_pair(s_q * s_k / np.sqrt(head_dim) * LUT_STEPS),
        }
        for key in LAYER_REQUANTS:
            requant[key].append(pairs[key])
    eq, s_e = weight(params["E"])
    s_oi = scale("S2")
    one = layers == 1
    doc = {
        "config": {"d_model": params["E"].shape[1], "n_heads": n_heads, "d_ff": params["layers"][0]["W1"].shape[1],
                   "vocab": params["E"].shape[0], "seq_len": params["P"].shape[0],
                   **({} if one else {"n_layers": layers})},
        "requant": {**{key: values[0] if one else values for key, values in requant.items()},
                    "r_out": requant_pair(s_res / s_oi)},
        "weights_int8": {**{key: values[0] if one else values for key, values in matrices.items()},
                         "Eq": eq.ravel().tolist()},
        "embed_stream": {"EinA": np.round(params["E"] / s_res).astype(int).ravel().tolist(),
                         "PinA": np.round(params["P"] / s_res).astype(int).ravel().tolist()},
        "exp_lut": [max(1, int(round(LUT_ONE * np.exp(-i / LUT_STEPS)))) for i in range(NLUT)],
        "tokenizer": tokenizer.to_json(),
        # The int8 logits times this are the float model's: for the int8 model's bits per character.
        "logit_scale": float(np.exp(params["log_gain"]) * s_oi * s_e),
    }
    return doc


def _figures(hits, total, nats):
    return {"accuracy": hits / total, "bits_per_char": nats / total / np.log(2), "characters": total}


def _log_softmax_at(logits, targets):
    logits = logits - logits.max(axis=-1, keepdims=True)
    return (np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
            - np.log(np.exp(logits).sum(axis=-1)))


def float_figures(params, n_heads, ids, seq_len):
    """Teacher-forced next-character accuracy and bits per character of the float model."""
    hits = total = 0
    nats = 0.0
    for x, y in windows(ids, seq_len):
        logits = forward(params, x[None], n_heads)[0]
        hits += int((logits.argmax(axis=-1) == y).sum())
        nats -= float(_log_softmax_at(logits, y).sum())
        total += len(y)
    return _figures(hits, total, nats)


def int8_figures(model, ids, logit_scale):
    """The same of the int8 model, on its golden decode steps (a cache per window): its
    arg-max, and its integer logits times ``logit_scale`` for bits per character."""
    golden = Golden(model)
    hits = total = 0
    nats = 0.0
    for x, y in windows(ids, model.seq_len):
        golden.reset()
        logits = np.stack([golden.step(int(tok)).logits for tok in x]).astype(np.float64) * logit_scale
        hits += int((logits.argmax(axis=-1) == y).sum())
        nats -= float(_log_softmax_at(logits, y).sum())
        total += len(y)
    return _figures(hits, total, nats)


def int8_model(doc):
    """The validated model of a quantised file."""
    return from_json(doc)
