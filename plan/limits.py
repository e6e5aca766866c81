"""What a loadable build takes: any model of its shape whose values stay within its limits.

A baked build sizes each datapath from its one model's bounds. A loadable build (issue: one
bitstream per shape, docs/loading.md) must size them before it knows the model, so it states
limits instead: the shape exactly, then the widths of what a model chooses (its requant
multipliers, its embeddings, its exponential table) and of what those choices make wide (the
residual stream, the FFN's hidden value before its second requant). Weights are any int8 and
shifts any the format allows. :func:`check_limits` refuses a model outside them, naming the
field, the layer and the limit; :func:`envelope` gives the bounds any model within them can
reach, every intermediate of every layer, for the plan to size the datapaths from.
"""

import dataclasses
from dataclasses import dataclass

from int8model.bounds import Bound, analyse, signed_bits

__all__ = ["Limits", "LimitError", "limits_for", "check_limits", "envelope", "WIDE"]

INT8 = Bound(-128, 127)
# The wide intermediates a model's requant pairs make: held to the residual stream's width,
# but ``hid``, which goes to ``r_hid`` before it meets the residual stream.
WIDE = {"x": "residual_bits", "o": "residual_bits", "s1": "residual_bits", "f": "residual_bits",
        "s2": "residual_bits", "hid": "hidden_bits"}
SHAPE_FIELDS = ("d_model", "n_heads", "d_ff", "vocab", "seq_len", "n_layers")


class LimitError(ValueError):
    """A model a loadable build cannot take: the field, the layer, its value and the limit."""


@dataclass(frozen=True)
class Limits:
    """A loadable build's shape and limits (signed widths in bits, ``exp_bits`` unsigned)."""
    d_model: int
    n_heads: int
    d_ff: int
    vocab: int
    seq_len: int
    n_layers: int = 1
    max_nlut: int = 128          # the exponential table's entries, at most
    exp_bits: int = 16           # each entry in 0 .. 2**exp_bits - 1
    multiplier_bits: int = 18    # every requant multiplier M: one MULT18X18D's operand
    embedding_bits: int = 16     # every EinA and PinA value
    residual_bits: int = 24      # x, o, s1, f and s2 of every layer
    hidden_bits: int = 24        # rq(acc_h, M_h), before the ReLU and r_hid

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    def describe(self):
        """One line, as the report and IDENT state them."""
        shape = f"d_model {self.d_model}, {self.n_heads} heads, d_ff {self.d_ff}, vocab {self.vocab}, " \
                f"context {self.seq_len}, {self.n_layers} layer{'s' if self.n_layers > 1 else ''}"
        return (f"{shape}; weights any int8, shifts 0..63, multipliers {self.multiplier_bits}-bit, embeddings "
                f"{self.embedding_bits}-bit, exp table up to {self.max_nlut} entries of {self.exp_bits} bits, "
                f"residual stream {self.residual_bits}-bit, FFN hidden {self.hidden_bits}-bit")


def limits_for(model, **overrides):
    """The limits a loadable build for ``model``'s shape chooses: the defaults of
    :class:`Limits`, widened where ``model`` itself needs more, so that it always loads."""
    needs = _needs(model)
    limits = Limits(**{name: getattr(model, name) for name in SHAPE_FIELDS})
    chosen = {name: max(getattr(limits, name), needs[name]) for name in
              ("max_nlut", "exp_bits", "multiplier_bits", "embedding_bits", "residual_bits", "hidden_bits")}
    return dataclasses.replace(limits, **(chosen | overrides))


def _needs(model):
    bounds = analyse(model)
    return {
        "max_nlut": model.nlut,
        "exp_bits": max(1, int(model.exp_lut.max()).bit_length()),
        "multiplier_bits": max(signed_bits(multiplier, multiplier)
                               for layer in model.layers for multiplier, _ in layer.requant.values()),
        "embedding_bits": max(signed_bits(int(values.min()), int(values.max()))
                              for values in (model.embed, model.positions)),
        "residual_bits": max(layer[name].bits for layer in bounds.layers for name, field in WIDE.items()
                             if field == "residual_bits"),
        "hidden_bits": max(layer["hid"].bits for layer in bounds.layers),
    }


def check_limits(model, limits):
    """Raise :class:`LimitError` unless ``model`` is of ``limits``' shape and within its limits."""
    for name in SHAPE_FIELDS:
        if getattr(model, name) != getattr(limits, name):
            raise LimitError(f"config.{name} is {getattr(model, name)}; this build's shape has {getattr(limits, name)}")
    if model.nlut > limits.max_nlut:
        raise LimitError(f"exp_lut has {model.nlut} entries; this build's table holds {limits.max_nlut}")
    top = int(model.exp_lut.max())
    if top >= 1 << limits.exp_bits:
        raise LimitError(f"exp_lut[{int(model.exp_lut.argmax())}] is {top}; this build's entries are "
                         f"{limits.exp_bits}-bit, at most {(1 << limits.exp_bits) - 1}")
    for key, values in (("EinA", model.embed), ("PinA", model.positions)):
        bound = Bound(int(values.min()), int(values.max()))
        if bound.bits > limits.embedding_bits:
            raise LimitError(f"embed_stream.{key} reaches [{bound.lo}, {bound.hi}], {bound.bits} bits; this build's "
                             f"embeddings are {limits.embedding_bits}-bit")
    pairs = [(f"requant.{key}" + (f" of layer {index}" if model.n_layers > 1 else ""), pair)
             for index, layer in enumerate(model.layers) for key, pair in layer.requant.items() if key != "r_out"]
    for where, (multiplier, _) in pairs + [("requant.r_out", model.r_out)]:
        bits = signed_bits(multiplier, multiplier)
        if bits > limits.multiplier_bits:
            raise LimitError(f"{where} has multiplier {multiplier}, {bits} bits; this build's multipliers are "
                             f"{limits.multiplier_bits}-bit")
    bounds = analyse(model)
    for index, layer in enumerate(bounds.layers):
        where = f" in layer {index}" if model.n_layers > 1 else ""
        for name, field in WIDE.items():
            bound, bits = layer[name], getattr(limits, field)
            if bound.bits > bits:
                what = "residual stream" if field == "residual_bits" else "FFN's hidden value"
                raise LimitError(f"{name}{where} can reach [{bound.lo}, {bound.hi}], {bound.bits} bits; this build's "
                                 f"{what} is {bits}-bit (its requant pairs or embeddings are too large)")


def envelope(limits):
    """The bounds of every intermediate of a step, as :func:`int8model.bounds.analyse` names
    them, that any model within ``limits`` can reach: one dict per layer, then the top's."""
    multiplier = Bound.signed(limits.multiplier_bits)
    residual, hidden = Bound.signed(limits.residual_bits), Bound.signed(limits.hidden_bits)
    d, dff, rows, head_dim = limits.d_model, limits.d_ff, limits.seq_len, limits.head_dim
    weight = Bound(0, (1 << limits.exp_bits) - 1)

    def accumulator(inputs):  # int8 inputs times int8 weights, summed over ``inputs`` rows
        return (INT8 * INT8).times(inputs)

    def requant(b, source, name, result):
        # Any shift of a product keeps it within the product's bound, which holds 0.
        product = b[source] * multiplier
        b[f"{source}*{name}"] = product
        return result if result is not None else product

    layer = {"x": residual}
    layer["xi"] = requant(layer, "x", "r_qkv", INT8)
    for name, pair in (("q", "M_q"), ("k", "M_k"), ("v", "M_v")):
        layer[f"acc_{name}"] = accumulator(d)
        layer[name] = requant(layer, f"acc_{name}", pair, INT8)
    layer["scores"] = accumulator(head_dim)
    layer["score_gap"] = Bound(0, layer["scores"].hi - layer["scores"].lo)
    requant(layer, "score_gap", "M_score", None)
    layer["lut_index"] = Bound(0, limits.max_nlut - 1)
    layer["weights"] = weight
    layer["den"] = Bound(1, rows * weight.hi)
    layer["num"] = Bound(rows * weight.hi * INT8.lo, rows * weight.hi * INT8.hi)
    layer["ctx"] = INT8
    layer["ci"] = requant(layer, "ctx", "r_ctx", INT8)
    layer["acc_o"] = accumulator(d)
    layer["o"] = requant(layer, "acc_o", "M_o", residual)
    layer["s1"] = residual
    layer["hi"] = requant(layer, "s1", "r_ffn", INT8)
    layer["acc_h"] = accumulator(d)
    layer["hid"] = requant(layer, "acc_h", "M_h", hidden)
    layer["relu"] = Bound(0, hidden.hi)
    layer["fi"] = requant(layer, "relu", "r_hid", INT8)
    layer["acc_f"] = accumulator(dff)
    layer["f"] = requant(layer, "acc_f", "M_f", residual)
    layer["s2"] = residual
    top = {"oi": requant({"s2": residual}, "s2", "r_out", INT8), "s2*r_out": residual * multiplier,
           "logits": accumulator(d)}
    return [dict(layer) for _ in range(limits.n_layers)], top
