"""The golden model: the decode step of docs/semantics.md in NumPy ``int64``, bit for bit.

Every stage is a function of its own so that a hardware unit can be held against exactly the
stage it implements; :meth:`Golden.step` composes them and returns every intermediate.
Before a model runs, :func:`int8model.bounds.analyse` proves that no intermediate leaves the
signed 64-bit range, so NumPy's wrapping arithmetic never wraps here.
"""

from dataclasses import dataclass

import numpy as np

from .bounds import analyse

__all__ = ["DecodeError", "check_token", "check_generation", "rq", "c8", "to8", "fdiv", "matvec", "projections",
           "attention", "argmax", "LayerTrace", "Trace", "Golden"]


class DecodeError(ValueError):
    """A request the model cannot serve: a token outside the vocab, a position past the cache."""


def rq(x, pair):
    """``(x · M) >> S``: the exact product, shifted arithmetically (floor toward −∞)."""
    multiplier, shift = pair
    return (np.asarray(x, dtype=np.int64) * np.int64(multiplier)) >> np.int64(shift)


def c8(x):
    """Saturate to int8."""
    return np.clip(x, -128, 127)


def to8(x, pair):
    return c8(rq(x, pair))


def fdiv(a, b):
    """Floor division (Python's ``//``), for ``b > 0``."""
    return np.floor_divide(a, b)


def matvec(x, matrix):
    """``y[j] = Σ_e x[e] · W[e, j]`` (matrices are stored input-major)."""
    return np.asarray(x, dtype=np.int64) @ matrix


def projections(model, tok, pos):
    """Steps 1 and 2 for ``tok`` at ``pos``, in the first layer: ``x``, ``xi``, ``q``, ``k``,
    ``v``. They depend on the token and the position only."""
    x = model.embed[tok] + model.positions[pos]
    return (x, *_layer_projections(model.layers[0], x))


def _layer_projections(layer, x):
    r, w = layer.requant, layer.weights
    xi = to8(x, r["r_qkv"])
    q = to8(matvec(xi, w["Wq"]), r["M_q"])
    k = to8(matvec(xi, w["Wk"]), r["M_k"])
    v = to8(matvec(xi, w["Wv"]), r["M_v"])
    return xi, q, k, v


def attention(q, keys, values, n_heads, score_pair, exp_lut):
    """LUT-softmax attention of ``q`` (d) over cache rows ``keys``, ``values`` (rows × d).

    Returns ``(scores, lut_index, weights, den, num, ctx)``, per head: ``scores``,
    ``lut_index`` and ``weights`` are heads × rows, ``den`` is per head, ``num`` and ``ctx``
    are heads × head_dim. ``ctx`` is the floor of the weighted mean, before ``r_ctx``.
    """
    rows, d = keys.shape
    head_dim = d // n_heads
    qh = q.reshape(n_heads, head_dim)
    kh = keys.reshape(rows, n_heads, head_dim)
    vh = values.reshape(rows, n_heads, head_dim)
    scores = np.einsum("hd,jhd->hj", qh, kh)
    peak = scores.max(axis=1, keepdims=True)
    lut_index = np.clip(rq(peak - scores, score_pair), 0, len(exp_lut) - 1)
    weights = exp_lut[lut_index]
    den = weights.sum(axis=1)
    num = np.einsum("hj,jhd->hd", weights, vh)
    ctx = fdiv(num, den[:, None])
    return scores, lut_index, weights, den, num, ctx


def check_token(model, tok):
    if not (isinstance(tok, (int, np.integer)) and 0 <= tok < model.vocab):
        raise DecodeError(f"token {tok} is outside the vocab 0..{model.vocab - 1}")


def check_generation(model, prompt, count):
    """Refuse, before anything runs, a generation that no decoder could serve."""
    if not prompt:
        raise DecodeError("the prompt is empty: a generation needs at least one token")
    if len(prompt) > model.seq_len:  # before the count, which the default makes from the prompt
        raise DecodeError(f"{len(prompt)} prompt tokens, but the cache holds seq_len {model.seq_len}")
    if count < 1:
        raise DecodeError(f"cannot generate {count} tokens")
    for tok in prompt:
        check_token(model, tok)
    steps = len(prompt) + count - 1
    if steps > model.seq_len:
        raise DecodeError(
            f"{len(prompt)} prompt tokens and {count} generated need {steps} positions, "
            f"but the cache holds seq_len {model.seq_len}")


def argmax(logits):
    """The first maximal index: ties go to the lowest token id."""
    return int(np.argmax(logits))


@dataclass(frozen=True)
class LayerTrace:
    """Every intermediate of one layer of a step (the names of docs/semantics.md); ``x`` is the
    residual stream entering the layer, ``s2`` the one leaving it."""
    x: np.ndarray
    xi: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scores: np.ndarray
    lut_index: np.ndarray
    weights: np.ndarray
    den: np.ndarray
    num: np.ndarray
    ctx: np.ndarray
    ci: np.ndarray
    s1: np.ndarray
    hi: np.ndarray
    hid: np.ndarray
    fi: np.ndarray
    s2: np.ndarray

    #: The order in which a layer makes its intermediates, for naming the first that differs.
    STAGES = ("x", "xi", "q", "k", "v", "scores", "lut_index", "weights", "den", "num", "ctx",
              "ci", "s1", "hi", "hid", "fi", "s2")


@dataclass(frozen=True)
class Trace:
    """Every intermediate of one step: each layer's, then the head's. A one-layer trace also
    answers its layer's names itself (``trace.q`` for ``trace.layers[0].q``)."""
    tok: int
    pos: int
    layers: tuple
    oi: np.ndarray
    logits: np.ndarray
    next: int

    def __getattr__(self, name):
        if name in LayerTrace.STAGES and len(self.layers) == 1:
            return getattr(self.layers[0], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


class Golden:
    """The reference decoder: a model, its KV cache (a pair of tables per layer), and the
    position of the next step."""

    def __init__(self, model):
        self.model = model
        self.bounds = analyse(model)  # refuses a model that could overflow int64
        shape = (model.n_layers, model.seq_len, model.d_model)
        self.keys = np.zeros(shape, dtype=np.int64)
        self.values = np.zeros(shape, dtype=np.int64)
        self.pos = 0

    def reset(self):
        """Start a new sequence; no row of the previous one is ever read again."""
        self.keys[:] = 0
        self.values[:] = 0
        self.pos = 0

    def step(self, tok):
        """Run one decode step for ``tok`` at the current position; return its :class:`Trace`."""
        m = self.model
        check_token(m, tok)
        pos = self.pos
        if pos >= m.seq_len:
            raise DecodeError(f"position {pos} is past the cache: seq_len is {m.seq_len}")
        x = m.embed[tok] + m.positions[pos]
        layers = []
        for index, layer in enumerate(m.layers):
            trace = self._layer(index, layer, x, pos)
            layers.append(trace)
            x = trace.s2
        oi = to8(x, m.r_out)
        logits = matvec(oi, m.head.T)
        self.pos = pos + 1
        return Trace(tok, pos, tuple(layers), oi, logits, argmax(logits))

    def _layer(self, index, layer, x, pos):
        """Steps 1–6 of one layer, its residual stream in ``x``; its cache row at ``pos`` written."""
        m, r, w = self.model, layer.requant, layer.weights
        xi, q, k, v = _layer_projections(layer, x)
        self.keys[index, pos] = k
        self.values[index, pos] = v
        scores, lut_index, weights, den, num, ctx = attention(
            q, self.keys[index, :pos + 1], self.values[index, :pos + 1], m.n_heads, r["M_score"], m.exp_lut)
        ci = to8(ctx.reshape(-1), r["r_ctx"])
        s1 = x + rq(matvec(ci, w["Wo"]), r["M_o"])
        hi = to8(s1, r["r_ffn"])
        hid = rq(matvec(hi, w["W1"]), r["M_h"])
        fi = to8(np.maximum(hid, 0), r["r_hid"])
        s2 = s1 + rq(matvec(fi, w["W2"]), r["M_f"])
        return LayerTrace(x, xi, q, k, v, scores, lut_index, weights, den, num, ctx, ci, s1, hi, hid, fi, s2)

    def steps(self, prompt, count):
        """The generation of docs/semantics.md from a fresh cache: yield the :class:`Trace` of
        every step, the prompt's and the generated ones.

        Refuses, before any step runs, a prompt and count that would run past ``seq_len``.
        """
        prompt = list(prompt)
        check_generation(self.model, prompt, count)
        self.reset()
        for tok in prompt:
            trace = self.step(tok)
            yield trace
        for _ in range(count - 1):
            trace = self.step(trace.next)
            yield trace

    def generate(self, prompt, count):
        """Yield the :class:`Trace` of each generated token (see :meth:`steps`)."""
        prompt = list(prompt)
        for index, trace in enumerate(self.steps(prompt, count)):
            if index >= len(prompt) - 1:
                yield trace
