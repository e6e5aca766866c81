"""How an engine is arranged for a model: what changes its cycles and its resources, never its results."""

import dataclasses
from dataclasses import dataclass

__all__ = ["Shape", "DEFAULT_WAYS", "MAX_WAYS", "DEFAULT_ATTENTION_ROWS", "ATTENTION_ROWS", "QKV_TABLE_BYTES",
           "XI_TABLE_BYTES", "lanes_for", "qkv_table_depth", "qkv_table_fits", "xi_table_depth", "xi_table_fits"]

# Elements a cycle between the units: four, as on the 85F, where the seed-size model's 32
# lanes take 96 DSP multipliers and 32 in LUTs (one way), beside attention's 32 and the
# epilogues'.
DEFAULT_WAYS = 4

# The most ways a build chooses by itself. On the 85F, 16 lanes of eight ways (as many
# multipliers as 32 of four) take fewer cycles a token, but each lane's sum of ten product
# terms in one cycle built far slower (docs/timing.md).
MAX_WAYS = 4

# Cache rows a cycle in attention's two row phases: the first bank's products in DSP blocks,
# the others' in LUTs. Powers of two: the cache banks are addressed by a row's low bits.
DEFAULT_ATTENTION_ROWS = 2
ATTENTION_ROWS = (1, 2, 4)

# A table of q, K[pos] and V[pos] for every token and position, when it takes at most this
# many bytes: in a one-layer model they depend on the token and the position only (steps 1
# and 2), so a step reads them in one cycle, and attention starts at once rather than after
# the QKV product. The seed-size model's takes 96 KB, 43 of the 85F's 208 block RAMs.
QKV_TABLE_BYTES = 128 * 1024

# Otherwise, a table of xi = to8(EinA[tok] + PinA[pos], r_qkv) for every token and position,
# when it takes at most this many bytes: the first product then starts from it, without
# waiting for x to pass through the epilogue (which still stores x for the residual).
XI_TABLE_BYTES = 64 * 1024


def lanes_for(model, ways, share=1):
    """The default lanes: one per column of a d_model-wide product (or of its ``share``-th
    part), rounded up to whole words."""
    columns = -(-model.d_model // share)
    return -(-columns // ways) * ways


def qkv_table_depth(model):
    """Rows of the q, k, v table: a power-of-two stride per token, so that its address is a
    concatenation of token and position."""
    return model.vocab << (model.seq_len - 1).bit_length()


def qkv_table_fits(model):
    """Whether the engine reads q, k and v from a table by default: a one-layer model's, where
    it takes at most ``QKV_TABLE_BYTES``."""
    return model.n_layers == 1 and qkv_table_depth(model) * 3 * model.d_model <= QKV_TABLE_BYTES


def xi_table_depth(model, ways):
    """Words of the xi table: a power-of-two stride per position and per token, so that its
    address is a concatenation of token, position and word."""
    words = -(-model.d_model // ways)
    return model.vocab << ((model.seq_len - 1).bit_length() + (words - 1).bit_length())


def xi_table_fits(model, ways):
    return xi_table_depth(model, ways) * ways <= XI_TABLE_BYTES


@dataclass(frozen=True)
class Shape:
    """The options of an engine's arrangement: ``lanes`` MAC lanes of ``ways`` multipliers (the
    last ``lut_ways`` of them in LUT logic), q, k and v from a table (``qkv_table``), the FFN's
    hidden vector kept in the lanes (``hidden_in_lanes``), ``attention_rows`` cache rows a
    cycle. ``None``: decided for the model (:meth:`resolved`) or by the part's choice."""
    lanes: int | None = None
    ways: int | None = DEFAULT_WAYS
    lut_ways: int | None = 0
    qkv_table: bool | None = None
    hidden_in_lanes: bool = False
    attention_rows: int = DEFAULT_ATTENTION_ROWS

    def resolved(self, model):
        """The same shape with its defaults decided for ``model``."""
        return dataclasses.replace(
            self, lanes=self.lanes or lanes_for(model, self.ways),
            qkv_table=qkv_table_fits(model) if self.qkv_table is None else bool(self.qkv_table))

    def describe(self):
        return (f"{self.lanes} lanes x {self.ways} ways ({self.lut_ways} in LUTs), q, k, v "
                + ("from a table" if self.qkv_table else "computed")
                + (", the hidden vector in the lanes" if self.hidden_in_lanes else "")
                + f", {self.attention_rows} cache rows a cycle")
