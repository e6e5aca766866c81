"""A decode step as one table: its stages in the order of docs/semantics.md, steps 1 to 7.

A *stage* is a vector on its way between two products: it enters the epilogue as a product's
sums (or as the embedding's ``x``), goes through a first requant (adding a residual vector),
may be stored in the residual stream, goes through a last requant to int8, and leaves into the
next product (or is collected: q, k and v go to the cache and attention). A *matrix* is a
product of the MAC lanes: which weights, which stage it takes its input from, which stage its
sums make. Everything that routes a value through the engine reads these two tables.
"""

import enum
from dataclasses import dataclass

from int8model.bounds import Bound

from .arithmetic import LoadedRule, Rule

__all__ = ["Stage", "Matrix", "StageStep", "MatrixStep", "STAGES", "MATRICES", "LAYER_MATRICES", "matrix_index",
           "head_index", "product_matrices", "hidden_rules", "StagePlan", "stage_plans"]


class Stage(enum.IntEnum):
    """What a value passing through the epilogue is."""
    EMBED = 0  # x → store x → xi = to8(x, r_qkv)
    Q = 1      # q = to8(acc, M_q)
    K = 2      # K[pos] = to8(acc, M_k)
    V = 3      # V[pos] = to8(acc, M_v)
    O = 4      # s1 = x + rq(acc, M_o) → store s1 → hi = to8(s1, r_ffn)
    H = 5      # fi = to8(max(0, rq(acc, M_h)), r_hid)
    F = 6      # s2 = s1 + rq(acc, M_f) → oi = to8(s2, r_out)


class Matrix(enum.IntEnum):
    """The products of the MAC lanes, in the order a step needs them."""
    QKV = 0   # xi · [Wq Wk Wv]
    WO = 1    # ci · Wo
    W1 = 2    # hi · W1
    W2 = 3    # fi · W2
    HEAD = 4  # oi · Eqᵀ


@dataclass(frozen=True)
class StageStep:
    """A stage as docs/semantics.md writes it: its step, its product, its requant pairs (by the
    model file's names), what it adds and stores of the residual stream, where it goes."""
    stage: Stage
    step: int
    made_by: Matrix | None  # None: the embedding
    first: str | None       # the first requant's pair, None where the stage skips it
    first_kind: str | None  # "to8" (clamped to int8), "rq" (wide), "relu" (wide, then ReLU)
    adds: str | None        # the stored vector added after the first requant's shift
    stores: str | None      # the vector stored as it enters the last requant
    last: str | None        # the last requant's pair (to int8), None where the stage leaves after the first
    feeds: Matrix | None    # the product its int8 output goes into; None: collected (q, k, v)
    output: str             # its int8 output's name in the golden trace


STAGES = (
    StageStep(Stage.EMBED, 1, None, None, None, None, "x", "r_qkv", Matrix.QKV, "xi"),
    StageStep(Stage.Q, 2, Matrix.QKV, "M_q", "to8", None, None, None, None, "q"),
    StageStep(Stage.K, 2, Matrix.QKV, "M_k", "to8", None, None, None, None, "k"),
    StageStep(Stage.V, 2, Matrix.QKV, "M_v", "to8", None, None, None, None, "v"),
    # Step 3, attention, is a unit of its own: ci goes from it into WO.
    StageStep(Stage.O, 4, Matrix.WO, "M_o", "rq", "x", "s1", "r_ffn", Matrix.W1, "hi"),
    StageStep(Stage.H, 5, Matrix.W1, "M_h", "relu", None, None, "r_hid", Matrix.W2, "fi"),
    StageStep(Stage.F, 6, Matrix.W2, "M_f", "rq", "s1", None, "r_out", Matrix.HEAD, "oi"),
    # Step 7, the head's arg-max, is a unit of its own: it takes HEAD's sums.
)


@dataclass(frozen=True)
class MatrixStep:
    """A product: the model's weights it multiplies by (side by side, ``Eq`` transposed), the
    name of its input vector (the golden trace's), and the stage its sums make (``None``: the
    arg-max takes them)."""
    matrix: Matrix
    weights: tuple
    transposed: bool
    rows: str   # the model's size its rows count: "d_model" or "d_ff"
    input: str
    sums_to: Stage | None


MATRICES = (
    MatrixStep(Matrix.QKV, ("Wq", "Wk", "Wv"), False, "d_model", "xi", Stage.Q),
    MatrixStep(Matrix.WO, ("Wo",), False, "d_model", "ci", Stage.O),
    MatrixStep(Matrix.W1, ("W1",), False, "d_model", "hi", Stage.H),
    MatrixStep(Matrix.W2, ("W2",), False, "d_ff", "fi", Stage.F),
    MatrixStep(Matrix.HEAD, ("Eq",), True, "d_model", "oi", None),
)


def product_matrices(model):
    """Each product's matrix, in the lanes' order (each layer's QKV, WO, W1, W2, then the
    head), from a model: its weights side by side (``Eq`` transposed)."""
    import numpy as np

    def matrix(weights, step):
        return np.concatenate([weights[k].T if step.transposed else weights[k] for k in step.weights], axis=1)
    return [matrix(layer.weights, step) for layer in model.layers for step in MATRICES[:LAYER_MATRICES]] + \
        [matrix(model.layers[-1].weights, MATRICES[Matrix.HEAD])]


def matrix_index(layer, kind):
    """The lanes' index of layer ``layer``'s product ``kind`` (QKV, WO, W1 or W2): each layer's
    four in turn, layer 0 first."""
    return LAYER_MATRICES * layer + kind


LAYER_MATRICES = len(Matrix) - 1  # a layer's products: all but the head


def head_index(n_layers):
    """The lanes' index of the head's product, after every layer's."""
    return LAYER_MATRICES * n_layers


@dataclass(frozen=True)
class StagePlan:
    """A stage of one layer, for one model: its rules (``None`` where it skips that requant;
    the hidden stage's ``r_hid`` folded into its first rule where they compose, or applied by a
    table of results in the first requant's last stage, ``then``), the residual vector it adds
    and the one it stores, the range of the values that enter its first requant, the lanes'
    product (an index, :func:`matrix_index`) its int8 output goes into, and where that output
    goes: into a product (``"lanes"``), collected (``"q"``, ``"k"``, ``"v"``), dropped
    (``"dropped"``: xi, where the lanes read it from a table, or q, k and v come from one, and
    the embedding only stores x) or nowhere (``"unused"``: the embedding of a layer above the
    first, whose x is the layer below's s2).

    A layer below the last ends as the next begins: its F stage stores ``s2`` as the next
    layer's ``x`` and requantises it by the next layer's ``r_qkv`` into its QKV product."""
    layer: int
    step: StageStep
    first: Rule | None
    then: Rule | None
    last: Rule | None
    adds: str | None
    stores: str | None
    in_bound: Bound
    feeds: int | None
    output: str

    @property
    def stage(self):
        return self.step.stage

    @property
    def select(self):
        """The epilogue's index of this stage's rules: each layer's stages in turn."""
        return len(Stage) * self.layer + self.stage


def hidden_rules(requant):
    """The rules that make ``fi`` of the hidden stage's sums (docs/semantics.md, step 5): ReLU
    after ``M_h``, then ``r_hid``, as one rule where ``r_hid`` only shifts (:meth:`Rule.then`)."""
    first, last = Rule.rq(requant["M_h"], relu=True), Rule.to8(requant["r_hid"])
    folded = first.then(last)
    return [first, last] if folded is None else [folded]


def _first_rule(step, requant):
    if step.first is None:
        return None
    pair = requant[step.first]
    return Rule.to8(pair) if step.first_kind == "to8" else Rule.rq(pair, relu=step.first_kind == "relu")


def _loaded_rules(step, b, multiplier_bits):
    """A loadable build's rules of a stage: the stage's ReLU and clamps, the multiplier and
    shift from registers, and the wide results within the limits' bounds (the epilogue's
    first requant adds the residual vector: its results are ``s1``, ``s2``)."""
    first = None
    if step.first is not None:
        result = {Stage.O: b["s1"], Stage.H: b["relu"], Stage.F: b["s2"]}.get(step.stage)
        first = LoadedRule(multiplier_bits, relu=step.first_kind == "relu", saturate=step.first_kind == "to8",
                           result=result)
    return first, LoadedRule(multiplier_bits)


def stage_plans(model, bounds, *, xi_dropped, hidden_table_limit, limits=None):
    """Each layer's stages (:class:`StagePlan`, a tuple of them per layer) for a model and its
    ``bounds`` (:func:`int8model.bounds.analyse`). The hidden stage takes ``r_hid`` into its
    first requant where the two rules compose (:meth:`Rule.then`) or where ``r_hid``'s results
    on the ReLU's range take at most ``hidden_table_limit`` entries (then a table of them).
    ``xi_dropped``: the embedding's xi goes nowhere (it comes from a table, or q, k and v do).
    With ``limits`` (a :class:`~.limits.Limits`; ``model`` unused), a loadable build's: every
    rule a :class:`~.arithmetic.LoadedRule`, none folded or applied by a table."""
    from .arithmetic import ResultTable
    sources = {Stage.EMBED: "x", Stage.Q: "acc_q", Stage.K: "acc_k", Stage.V: "acc_v", Stage.O: "acc_o",
               Stage.H: "acc_h", Stage.F: "acc_f"}
    n_layers = len(bounds.layers)
    layers = []
    for layer, b in enumerate(bounds.layers):
        requant = None if limits else model.layers[layer].requant
        top = layer == n_layers - 1
        plans = []
        for step in STAGES:
            if limits:
                first, loaded_last = _loaded_rules(step, b, limits.multiplier_bits)
                last = loaded_last if step.last else None
            else:
                first = _first_rule(step, requant)
                last = Rule.to8(requant[step.last]) if step.last else None
            then, stores = None, step.stores
            feeds = None if step.feeds is None else matrix_index(layer, step.feeds)
            if limits:
                pass  # every stage's two rules as they stand, loaded
            elif step.stage == Stage.H:
                rules = hidden_rules(requant)
                if len(rules) == 1:
                    first, last = rules[0], None
                elif ResultTable.size(first.result_bound(b["acc_h"]), last) <= hidden_table_limit:
                    then, last = last, None
            if step.stage == Stage.F:
                if top:
                    feeds = head_index(n_layers)
                else:  # s2 is the next layer's x: stored, and its xi made for the next QKV
                    stores, feeds = "x", matrix_index(layer + 1, Matrix.QKV)
                    if not limits:
                        last = Rule.to8(model.layers[layer + 1].requant["r_qkv"])
            if step.stage == Stage.EMBED and layer > 0:
                output = "unused"
            elif step.feeds is None:
                output = step.output
            else:
                output = "dropped" if xi_dropped and step.stage == Stage.EMBED else "lanes"
            plans.append(StagePlan(layer, step, first, then, last, step.adds, stores, b[sources[step.stage]],
                                   feeds, output))
        layers.append(tuple(plans))
    return tuple(layers)
