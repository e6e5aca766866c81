"""Train the demo model: a one-layer character transformer on the Zen of Python, in NumPy.

The float model has the int8 model's architecture exactly (no normalisation; residual stream,
LUT-friendly softmax attention, ReLU FFN, head tied to the token embedding), so quantisation
only has to pick scales: per-tensor weight scales, and activation scales calibrated on the text
itself. Run ``python -m int8model.train --out models/zen.json`` to retrain and export.
"""

import argparse
import codecs
import contextlib
import io
import sys

import numpy as np

from .format import REQUANTS, from_json
from .golden import Golden

__all__ = ["corpus", "Tokenizer", "FloatModel", "train", "quantise", "accuracy_float", "accuracy_int8"]

# The softmax's exponential table: weight of a score `gap` below the row's maximum is
# LUT_ONE · exp(−gap), the gap measured in steps of 1/LUT_STEPS.
LUT_ONE = 1 << 12
LUT_STEPS = 16
NLUT = 128
# Residual stream resolution: the largest activation is this many units.
RESIDUAL_UNITS = 1 << 12


def corpus():
    """The Zen of Python (the standard library's ``this``), lowercased."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the poem
        import this
    return codecs.decode(this.s, "rot13").lower()


class Tokenizer:
    """One token per character; ids are positions in ``chars``."""

    def __init__(self, chars):
        self.chars = chars

    @classmethod
    def for_text(cls, text):
        return cls("".join(sorted(set(text))))

    def encode(self, text):
        unknown = sorted(set(text) - set(self.chars))
        if unknown:
            raise ValueError(f"characters outside the model's vocabulary: {''.join(unknown)!r}")
        return [self.chars.index(c) for c in text]

    def decode(self, tokens):
        return "".join(self.chars[t] for t in tokens)

    def to_json(self):
        return {"kind": "chars", "chars": self.chars}


class FloatModel:
    """The float twin of the int8 model, with hand-written gradients."""

    NAMES = ("E", "P", "Wq", "Wk", "Wv", "Wo", "W1", "W2", "log_gain")

    def __init__(self, rng, d_model, n_heads, d_ff, vocab, seq_len):
        self.d, self.heads, self.d_ff, self.vocab, self.seq_len = d_model, n_heads, d_ff, vocab, seq_len
        normal = lambda *shape, fan: rng.normal(0, 1 / np.sqrt(fan), size=shape)
        self.params = {
            "E": normal(vocab, d_model, fan=1) * 0.5, "P": normal(seq_len, d_model, fan=1) * 0.1,
            "Wq": normal(d_model, d_model, fan=d_model), "Wk": normal(d_model, d_model, fan=d_model),
            "Wv": normal(d_model, d_model, fan=d_model), "Wo": normal(d_model, d_model, fan=d_model),
            "W1": normal(d_model, d_ff, fan=d_model), "W2": normal(d_ff, d_model, fan=d_ff),
            "log_gain": np.zeros(()),
        }

    def forward(self, tokens):
        """Activations of a batch of windows ``tokens`` (B × T), as a dict."""
        p = self.params
        b, t = tokens.shape
        h, hd = self.heads, self.d // self.heads
        a = {"tokens": tokens}
        a["X"] = p["E"][tokens] + p["P"][None, :t]
        split = lambda m: m.reshape(b, t, h, hd).transpose(0, 2, 1, 3)
        a["Q"], a["K"], a["V"] = (a["X"] @ p[w] for w in ("Wq", "Wk", "Wv"))
        a["Qh"], a["Kh"], a["Vh"] = split(a["Q"]), split(a["K"]), split(a["V"])
        scores = a["Qh"] @ a["Kh"].transpose(0, 1, 3, 2) / np.sqrt(hd)
        causal = np.tril(np.ones((t, t), dtype=bool))
        scores = np.where(causal, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        a["A"] = weights / weights.sum(axis=-1, keepdims=True)
        a["C"] = (a["A"] @ a["Vh"]).transpose(0, 2, 1, 3).reshape(b, t, self.d)
        a["S1"] = a["X"] + a["C"] @ p["Wo"]
        a["Hp"] = a["S1"] @ p["W1"]
        a["Hr"] = np.maximum(a["Hp"], 0)
        a["S2"] = a["S1"] + a["Hr"] @ p["W2"]
        a["raw"] = a["S2"] @ p["E"].T
        a["logits"] = np.exp(p["log_gain"]) * a["raw"]
        return a

    def loss_and_grads(self, tokens, targets):
        p = self.params
        a = self.forward(tokens)
        b, t = tokens.shape
        h, hd = self.heads, self.d // self.heads
        logits = a["logits"] - a["logits"].max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
        n = b * t
        loss = -np.log(np.take_along_axis(probs, targets[..., None], axis=-1)).sum() / n
        g = {k: np.zeros_like(v) for k, v in p.items()}

        d_logits = probs
        np.put_along_axis(d_logits, targets[..., None],
                          np.take_along_axis(d_logits, targets[..., None], axis=-1) - 1, axis=-1)
        d_logits /= n
        gain = np.exp(p["log_gain"])
        g["log_gain"] = np.sum(d_logits * a["logits"])
        d_raw = gain * d_logits
        d_s2 = d_raw @ p["E"]
        g["E"] += np.einsum("btv,btd->vd", d_raw, a["S2"])
        g["W2"] = np.einsum("btf,btd->fd", a["Hr"], d_s2)
        d_hp = (d_s2 @ p["W2"].T) * (a["Hp"] > 0)
        g["W1"] = np.einsum("btd,btf->df", a["S1"], d_hp)
        d_s1 = d_s2 + d_hp @ p["W1"].T
        g["Wo"] = np.einsum("btd,bte->de", a["C"], d_s1)
        d_ch = (d_s1 @ p["Wo"].T).reshape(b, t, h, hd).transpose(0, 2, 1, 3)
        d_attn = d_ch @ a["Vh"].transpose(0, 1, 3, 2)
        d_vh = a["A"].transpose(0, 1, 3, 2) @ d_ch
        d_scores = a["A"] * (d_attn - (d_attn * a["A"]).sum(axis=-1, keepdims=True)) / np.sqrt(hd)
        d_qh = d_scores @ a["Kh"]
        d_kh = d_scores.transpose(0, 1, 3, 2) @ a["Qh"]
        merge = lambda m: m.transpose(0, 2, 1, 3).reshape(b, t, self.d)
        d_x = d_s1.copy()
        for name, grad in (("Wq", d_qh), ("Wk", d_kh), ("Wv", d_vh)):
            grad = merge(grad)
            g[name] = np.einsum("btd,bte->de", a["X"], grad)
            d_x += grad @ p[name].T
        np.add.at(g["E"], tokens, d_x)
        g["P"][:t] += d_x.sum(axis=0)
        return loss, g


def _windows(ids, length):
    return np.array([ids[i:i + length] for i in range(len(ids) - length + 1)])


def train(text, tokenizer, d_model=32, n_heads=4, d_ff=32, seq_len=32,
          steps=4000, batch=32, lr=3e-3, seed=0, log=None):
    """Train a :class:`FloatModel` with Adam on random windows of ``text``."""
    rng = np.random.default_rng(seed)
    ids = np.array(tokenizer.encode(text))
    windows = _windows(ids, seq_len + 1)
    model = FloatModel(rng, d_model, n_heads, d_ff, len(tokenizer.chars), seq_len)
    moment1 = {k: np.zeros_like(v) for k, v in model.params.items()}
    moment2 = {k: np.zeros_like(v) for k, v in model.params.items()}
    beta1, beta2 = 0.9, 0.999
    for step in range(1, steps + 1):
        chosen = windows[rng.integers(len(windows), size=batch)]
        loss, grads = model.loss_and_grads(chosen[:, :-1], chosen[:, 1:])
        rate = lr * min(1.0, step / 200) * (0.5 * (1 + np.cos(np.pi * step / steps)) * 0.9 + 0.1)
        for k, grad in grads.items():
            moment1[k] = beta1 * moment1[k] + (1 - beta1) * grad
            moment2[k] = beta2 * moment2[k] + (1 - beta2) * grad**2
            corrected1 = moment1[k] / (1 - beta1**step)
            corrected2 = moment2[k] / (1 - beta2**step)
            model.params[k] = model.params[k] - rate * corrected1 / (np.sqrt(corrected2) + 1e-8)
        if log and (step % 500 == 0 or step == 1):
            log(f"step {step:5d}  loss {loss:.3f}")
    return model


def requant_pair(ratio, multiplier_bits=15):
    """The requant (M, S) nearest ``ratio`` with |M| below 2**multiplier_bits."""
    if ratio == 0:
        return [0, 0]
    for shift in range(64):
        multiplier = int(round(ratio * 2**shift))
        if abs(multiplier) >= 2**(multiplier_bits - 1) or shift == 63:
            return [multiplier, shift]
    raise AssertionError("unreachable")


def eval_windows(ids, seq_len):
    """Non-overlapping windows covering the text: each character after the first is a target once."""
    out = []
    for start in range(0, len(ids) - 1, seq_len):
        chunk = ids[start:start + seq_len + 1]
        out.append((chunk[:-1], chunk[1:]))
    return out


def quantise(model, text, tokenizer):
    """The int8 model file (as a dict) of ``model``, activation scales calibrated on ``text``."""
    p = model.params
    ids = tokenizer.encode(text)
    tokens = [np.array(x) for x, _ in eval_windows(ids, model.seq_len)]
    acts = [model.forward(x[None]) for x in tokens]
    peak = lambda key: max(float(np.abs(a[key]).max()) for a in acts)

    def weight(name, matrix=None):
        matrix = p[name] if matrix is None else matrix
        scale = np.abs(matrix).max() / 127
        return np.clip(np.round(matrix / scale), -128, 127).astype(int), scale

    s_res = max(peak("X"), peak("S1"), peak("S2")) / RESIDUAL_UNITS
    s_xi = peak("X") / 127
    s_hi = peak("S1") / 127
    s_oi = peak("S2") / 127
    s_q, s_k, s_v = peak("Q") / 127, peak("K") / 127, peak("V") / 127
    s_fi = peak("Hr") / 127
    s_hid = s_fi / 8  # hid keeps three more bits than fi; r_hid drops them
    wq, s_wq = weight("Wq")
    wk, s_wk = weight("Wk")
    wv, s_wv = weight("Wv")
    wo, s_wo = weight("Wo")
    w1, s_w1 = weight("W1")
    w2, s_w2 = weight("W2")
    eq, _ = weight("E")
    head_dim = model.d // model.heads
    lut = [max(1, int(round(LUT_ONE * np.exp(-i / LUT_STEPS)))) for i in range(NLUT)]
    requant = {
        "r_qkv": requant_pair(s_res / s_xi), "r_ffn": requant_pair(s_res / s_hi), "r_out": requant_pair(s_res / s_oi),
        "r_ctx": [1, 0], "r_hid": [1, 3],
        "M_q": requant_pair(s_xi * s_wq / s_q), "M_k": requant_pair(s_xi * s_wk / s_k), "M_v": requant_pair(s_xi * s_wv / s_v),
        "M_o": requant_pair(s_v * s_wo / s_res), "M_h": requant_pair(s_hi * s_w1 / s_hid),
        "M_f": requant_pair(s_fi * s_w2 / s_res),
        "M_score": requant_pair(s_q * s_k / np.sqrt(head_dim) * LUT_STEPS),
    }
    assert set(requant) == set(REQUANTS)
    flat = lambda m: m.ravel().tolist()
    return {
        "config": {"d_model": model.d, "n_heads": model.heads, "d_ff": model.d_ff,
                   "vocab": model.vocab, "seq_len": model.seq_len},
        "requant": requant,
        "weights_int8": {"Wq": flat(wq), "Wk": flat(wk), "Wv": flat(wv), "Wo": flat(wo),
                         "W1": flat(w1), "W2": flat(w2), "Eq": flat(eq)},
        "embed_stream": {"EinA": flat(np.round(p["E"] / s_res).astype(int)),
                         "PinA": flat(np.round(p["P"] / s_res).astype(int))},
        "exp_lut": lut,
        "tokenizer": tokenizer.to_json(),
    }


def accuracy_float(model, ids):
    hits = total = 0
    for x, y in eval_windows(ids, model.seq_len):
        predicted = model.forward(np.array(x)[None])["logits"][0].argmax(axis=-1)
        hits += int((predicted == np.array(y)).sum())
        total += len(y)
    return hits / total


def accuracy_int8(int_model, ids):
    golden = Golden(int_model)
    hits = total = 0
    for x, y in eval_windows(ids, int_model.seq_len):
        golden.reset()
        for tok, target in zip(x, y):
            hits += golden.step(tok).next == target
            total += 1
    return hits / total


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m int8model.train", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the int8 model file (required)")
    parser.add_argument("--steps", type=int, default=4000, help="training steps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="the random seed of the initial weights and the batches "
                                                            "(default: %(default)s)")
    args = parser.parse_args(argv)
    text = corpus()
    tokenizer = Tokenizer.for_text(text)
    log = lambda line: print(line, file=sys.stderr)
    model = train(text, tokenizer, steps=args.steps, seed=args.seed, log=log)
    int_model = from_json(quantise(model, text, tokenizer))
    int_model.save(args.out)
    ids = tokenizer.encode(text)
    print(f"float top-1 accuracy {accuracy_float(model, ids):.1%}")
    print(f"int8  top-1 accuracy {accuracy_int8(int_model, ids):.1%}")
    print(int_model.identity_line)


if __name__ == "__main__":
    main()
