"""What a model puts into the memories its plan lays out: the values, apart from the decisions.

A plan says which memory holds what, how deep and how wide; :func:`make_contents` fills them
from one model's values. The hardware takes both: the plan to be built, the contents as its
memories' initial values.
"""

from dataclasses import dataclass

import numpy as np

from int8model.golden import projections

from .arithmetic import Rule
from .attention import exp_entries
from .lanes import weight_table
from .schedule import product_matrices

__all__ = ["Contents", "make_contents", "embedding_words"]


@dataclass(frozen=True, eq=False)
class Contents:
    """The initial values of a plan's memories, for the model ``sha256``: the lanes' weight
    table (:func:`~.lanes.weight_table`), the embedding ROMs' words, the q, k, v table's rows or
    the xi table's words (where the plan has one), the exp table as attention reads it."""
    sha256: str
    weights: np.ndarray
    token_embedding: list
    position_embedding: list
    qkv_rows: list | None
    xi_words: list | None
    exp_entries: list


def embedding_words(table, row_words, ways):
    """A table's rows as ROM words of ``ways`` entries, ``row_words`` words a row (zero past it)."""
    words = []
    for row in np.asarray(table).tolist():
        row = row + [0] * (row_words * ways - len(row))
        words += [row[at:at + ways] for at in range(0, len(row), ways)]
    return words


def _qkv_rows(plan, model):
    d = plan.model.d_model
    rows = []
    for tok in range(plan.model.vocab):
        for p in range(1 << plan.qkv.pos_bits):
            if p < plan.model.seq_len:
                _, _, q, k, v = projections(model, tok, p)
                rows.append({"q": q.tolist(), "k": k.tolist(), "v": v.tolist()})
            else:
                rows.append({"q": [0] * d, "k": [0] * d, "v": [0] * d})
    return rows


def _xi_words(plan, model):
    embedding = plan.embedding
    to_xi = Rule.to8(model.layers[0].requant["r_qkv"])
    words = []
    for tok in range(plan.model.vocab):
        for p in range(1 << plan.qkv.pos_bits):
            row = [0] * (embedding.row_words * embedding.ways)
            if p < plan.model.seq_len:
                for e in range(plan.model.d_model):
                    row[e] = to_xi.apply(int(model.embed[tok][e]) + int(model.positions[p][e]))
            words += [row[at:at + embedding.ways] for at in range(0, len(row), embedding.ways)]
    return words


def make_contents(plan, model):
    """The :class:`Contents` of ``model``'s values for ``plan`` (made for the same model)."""
    if model.sha256 != plan.model.sha256:
        raise ValueError(f"the plan was made for model sha256 {plan.model.sha256}, not {model.sha256}")
    matrices = product_matrices(model)
    return Contents(
        sha256=model.sha256, weights=weight_table(plan.lanes, matrices),
        token_embedding=embedding_words(model.embed, plan.embedding.row_words, plan.embedding.ways),
        position_embedding=embedding_words(model.positions, plan.embedding.row_words, plan.embedding.ways),
        qkv_rows=_qkv_rows(plan, model) if plan.qkv.table else None,
        xi_words=_xi_words(plan, model) if plan.qkv.xi_table else None,
        exp_entries=exp_entries(plan.attention, model.exp_lut))
