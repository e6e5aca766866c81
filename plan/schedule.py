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

from .arithmetic import Rule

__all__ = ["Stage", "Matrix", "StageStep", "MatrixStep", "STAGES", "MATRICES", "product_matrices", "hidden_rules", "StagePlan",
           "stage_plans"]


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


def product_matrices(weights):
    """Each product's matrix, in :class:`Matrix` order, from a model's ``weights``: its weights
    side by side (``Eq`` transposed)."""
    import numpy as np
    return [np.concatenate([weights[k].T if step.transposed else weights[k] for k in step.weights], axis=1)
            for step in MATRICES]


@dataclass(frozen=True)
class StagePlan:
    """A stage for one model: its rules (``None`` where it skips that requant; the hidden
    stage's ``r_hid`` folded into its first rule where they compose, or applied by a table of
    results in the first requant's last stage, ``then``), the range of the values that enter
    its first requant, and where its int8 output goes: into a product (``"lanes"``), collected
    (``"q"``, ``"k"``, ``"v"``) or dropped (``"dropped"``: xi, where the lanes read it from a
    table, or q, k and v come from one, and the embedding only stores x)."""
    step: StageStep
    first: Rule | None
    then: Rule | None
    last: Rule | None
    in_bound: Bound
    output: str

    @property
    def stage(self):
        return self.step.stage


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


def stage_plans(requant, bounds, *, xi_dropped, hidden_table_limit):
    """Each stage's :class:`StagePlan` for a model's ``requant`` pairs and ``bounds``
    (:func:`int8model.bounds.analyse`). The hidden stage takes ``r_hid`` into its first requant
    where the two rules compose (:meth:`Rule.then`) or where ``r_hid``'s results on the ReLU's
    range take at most ``hidden_table_limit`` entries (then a table of them). ``xi_dropped``:
    the embedding's xi goes nowhere (it comes from a table, or q, k and v do)."""
    from .arithmetic import ResultTable
    sources = {Stage.EMBED: "x", Stage.Q: "acc_q", Stage.K: "acc_k", Stage.V: "acc_v", Stage.O: "acc_o",
               Stage.H: "acc_h", Stage.F: "acc_f"}
    plans = []
    for step in STAGES:
        first = _first_rule(step, requant)
        last = Rule.to8(requant[step.last]) if step.last else None
        then = None
        if step.stage == Stage.H:
            rules = hidden_rules(requant)
            if len(rules) == 1:
                first, last = rules[0], None
            elif ResultTable.size(first.result_bound(bounds["acc_h"]), last) <= hidden_table_limit:
                then, last = last, None
        if step.feeds is not None:
            output = "dropped" if xi_dropped and step.stage == Stage.EMBED else "lanes"
        else:
            output = step.output
        plans.append(StagePlan(step, first, then, last, bounds[sources[step.stage]], output))
    return tuple(plans)
