"""Interval bounds of every intermediate of a decode step, from the model's own values.

The golden model uses them to refuse a model that could overflow ``int64``; the hardware uses
their widths (:attr:`Bound.bits`) to size its datapath. Bounds hold for any token, any position
and any cache content the model itself can write. All arithmetic here is Python's exact ``int``.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["Bound", "BoundsError", "ModelBounds", "analyse", "matvec_bound", "signed_bits"]

INT64 = (-2**63, 2**63 - 1)


class BoundsError(ValueError):
    """A model whose intermediates could leave the signed 64-bit range."""


def signed_bits(lo, hi):
    """The fewest bits of a two's complement signal that holds every value in ``[lo, hi]``."""
    bits = 1
    while not (-(1 << (bits - 1)) <= lo and hi <= (1 << (bits - 1)) - 1):
        bits += 1
    return bits


@dataclass(frozen=True)
class Bound:
    lo: int
    hi: int

    @property
    def bits(self):
        return signed_bits(self.lo, self.hi)

    @property
    def magnitude(self):
        return max(-self.lo, self.hi)

    def __add__(self, other):
        return Bound(self.lo + other.lo, self.hi + other.hi)

    def clamp(self, lo, hi):
        return Bound(min(max(self.lo, lo), hi), min(max(self.hi, lo), hi))

    @classmethod
    def signed(cls, bits):
        """Every value of a ``bits``-bit two's complement signal."""
        return cls(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)

    def __mul__(self, other):
        """The bound of a product of a value in ``self`` and one in ``other``."""
        corners = (self.lo * other.lo, self.lo * other.hi, self.hi * other.lo, self.hi * other.hi)
        return Bound(min(corners), max(corners))

    def times(self, constant):
        ends = (self.lo * constant, self.hi * constant)
        return Bound(min(ends), max(ends))

    def __rshift__(self, shift):
        return Bound(self.lo >> shift, self.hi >> shift)


def matvec_bound(inputs, matrix):
    """Bound of ``inputs @ matrix`` for any input vector within ``inputs``, per output column."""
    w = [[int(x) for x in row] for row in matrix.tolist()]
    los, his = [], []
    for j in range(len(w[0])):
        lo = hi = 0
        for row in w:
            a, b = inputs.lo * row[j], inputs.hi * row[j]
            lo += min(a, b)
            hi += max(a, b)
        los.append(lo)
        his.append(hi)
    return Bound(min(los), max(his))


class ModelBounds(dict):
    """The bounds of a step's intermediates: for a one-layer model, ``{name: Bound}`` itself;
    for any model, ``layers[l]``, each layer's (its ``x`` the residual stream entering it, its
    ``s2`` the one leaving it), and ``oi`` and ``logits`` at the top."""

    def __init__(self, layers, top):
        super().__init__(layers[0] if len(layers) == 1 else {})
        self.update(top)
        self.layers = tuple(layers)


def analyse(model):
    """Return the bounds of every intermediate of a step of ``model``, a :class:`ModelBounds`.

    Names (in each layer's dict): ``x``, ``x*r_qkv`` (the requant products, one per requant),
    ``xi``, ``acc_q``, ``acc_k``, ``acc_v``, ``q``, ``k``, ``v``, ``scores``, ``score_gap``
    (max − s), ``lut_index``, ``weights``, ``den``, ``num``, ``ctx``, ``ci``, ``acc_o``, ``o``,
    ``s1``, ``hi``, ``acc_h``, ``hid``, ``relu``, ``fi``, ``acc_f``, ``f``, ``s2``; at the top,
    ``oi`` and ``logits``. Each layer's ``x`` is the one before's ``s2`` (the first's, the
    embeddings'): the bounds follow the residual stream through every layer.

    Raises :class:`BoundsError` if any of them could leave ``int64``.
    """
    ein = [[int(v) for v in row] for row in model.embed.tolist()]
    pin = [[int(v) for v in row] for row in model.positions.tolist()]
    cols = range(model.d_model)
    x = Bound(min(min(e[c] for e in ein) + min(p[c] for p in pin) for c in cols),
              max(max(e[c] for e in ein) + max(p[c] for p in pin) for c in cols))
    layers = []
    for layer in model.layers:
        b = _layer_bounds(model, layer, x)
        layers.append(b)
        x = b["s2"]
    top = {}
    r_out = model.r_out
    top["s2*r_out"] = x.times(r_out[0])
    top["oi"] = (top["s2*r_out"] >> r_out[1]).clamp(-128, 127)
    top["logits"] = matvec_bound(top["oi"], np.asarray(model.head).T)
    for l, b in enumerate(layers + [top]):
        for name, bound in b.items():
            if bound.lo < INT64[0] or bound.hi > INT64[1]:
                where = f" in layer {l}" if l < len(layers) and len(layers) > 1 else ""
                raise BoundsError(
                    f"{name}{where} can reach [{bound.lo}, {bound.hi}], outside the signed 64-bit range: "
                    f"the model's requant multipliers or embeddings are too large")
    return ModelBounds(layers, top)


def _layer_bounds(model, layer, x):
    """One layer's bounds, for its input residual stream ``x``."""
    r = layer.requant
    w = layer.weights
    b = {"x": x}

    def requant(name, source, pair):
        multiplier, shift = r[pair]
        product = b[source].times(multiplier)
        b[f"{source}*{pair}"] = product
        b[name] = product >> shift
        return b[name]

    def to8(name, source, pair):
        requant(name, source, pair)
        b[name] = b[name].clamp(-128, 127)

    to8("xi", "x", "r_qkv")
    for name, matrix, pair in (("q", "Wq", "M_q"), ("k", "Wk", "M_k"), ("v", "Wv", "M_v")):
        b[f"acc_{name}"] = matvec_bound(b["xi"], w[matrix])
        to8(name, f"acc_{name}", pair)

    rows = model.seq_len
    term = b["q"] * b["k"]
    b["scores"] = Bound(term.lo * model.head_dim, term.hi * model.head_dim)
    b["score_gap"] = Bound(0, b["scores"].hi - b["scores"].lo)
    requant("lut_index", "score_gap", "M_score")
    b["lut_index"] = b["lut_index"].clamp(0, model.nlut - 1)
    lut = [int(v) for v in model.exp_lut.tolist()]
    b["weights"] = Bound(min(lut), max(lut))
    # The row holding the maximum always weighs exp_lut[0] > 0, so the denominator is positive.
    b["den"] = Bound(lut[0], lut[0] + (rows - 1) * max(lut))
    b["num"] = Bound(rows * max(lut) * min(b["v"].lo, 0), rows * max(lut) * max(b["v"].hi, 0))
    # A floored mean of values with non-negative weights lies between their extremes.
    b["ctx"] = b["v"]
    to8("ci", "ctx", "r_ctx")
    b["acc_o"] = matvec_bound(b["ci"], w["Wo"])
    requant("o", "acc_o", "M_o")
    b["s1"] = b["x"] + b["o"]
    to8("hi", "s1", "r_ffn")
    b["acc_h"] = matvec_bound(b["hi"], w["W1"])
    requant("hid", "acc_h", "M_h")
    b["relu"] = b["hid"].clamp(0, max(b["hid"].hi, 0))
    to8("fi", "relu", "r_hid")
    b["acc_f"] = matvec_bound(b["fi"], w["W2"])
    requant("f", "acc_f", "M_f")
    b["s2"] = b["s1"] + b["f"]
    return b
