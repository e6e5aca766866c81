import enum

from amaranth.hdl import Cat, Module, Mux, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from int8model.bounds import Bound

from .requant import Requant, ResultTable, Rule, multiplier_bits
from .residual import Residual

__all__ = ["Stage", "Epilogue", "hidden_rules"]


class Stage(enum.IntEnum):
    """What a value passing through the epilogue is (the step of docs/semantics.md it belongs to)."""
    EMBED = 0  # x → store x → xi = to8(x, r_qkv)
    Q = 1      # q = to8(acc, M_q)
    K = 2      # K[pos] = to8(acc, M_k)
    V = 3      # V[pos] = to8(acc, M_v)
    O = 4      # s1 = x + rq(acc, M_o) → store s1 → hi = to8(s1, r_ffn)
    H = 5      # fi = to8(max(0, rq(acc, M_h)), r_hid)
    F = 6      # s2 = s1 + rq(acc, M_f) → oi = to8(s2, r_out)


def hidden_rules(model):
    """The rules that make ``fi`` of the hidden stage's sums (docs/semantics.md, step 5): ReLU
    after ``M_h``, then ``r_hid``, as one rule where ``r_hid`` only shifts (:meth:`.Rule.then`)."""
    r = model.requant
    first, last = Rule.rq(r["M_h"], relu=True), Rule.to8(r["r_hid"])
    folded = first.then(last)
    return [first, last] if folded is None else [folded]


def _union(*bounds):
    return Bound(min(b.lo for b in bounds), max(b.hi for b in bounds))


class Epilogue(wiring.Component):
    """Everything between one matrix product and the next: requant and residual, requant.

    A value enters with its :class:`Stage` (``select``) and column (``tag``) and leaves as the
    int8 input of the next product (or a q, k, v element), after two requants in a chain:

    1. :class:`Requant` by the stage's multiplier (``M_q`` … ``M_f``; ReLU for ``M_h``),
       adding the residual's entry after the shift: ``s1 = x + rq(acc, M_o)``,
       ``s2 = s1 + rq(acc, M_f)``;
    2. :class:`Requant` to int8 by ``r_qkv``, ``r_ffn``, ``r_hid`` or ``r_out``.

    Between them the :class:`Residual` stores ``x`` and ``s1`` as they pass.
    Widths come from the model's bounds. The tag ``scratch`` (one past the widest vector)
    names no column: what is stored there is never read for a real one.

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"value", "tag", "select", "multiplier"})))``
    o : ``Out(stream.Signature(StructLayout({"value", "tag", "select"})))``, ``value`` int8.

    A stage skips the units it has nothing to do in: ``EMBED`` enters at the second requant,
    ``Q``, ``K`` and ``V`` leave after the first, and so does ``H`` where ``r_hid`` only
    shifts (its two rules are then one, see :meth:`.Rule.then`) or where the first requant
    applies it by a table of its results. Of the values in flight at any time, all
    belong to one stage (a decode step makes each stage's values from the previous stage's),
    so the paths never meet.

    Its input must come from registers (in the engine: the routed register slice), with the
    first requant's ``multiplier`` for the value's stage (:meth:`first_multiplier`).

    Latency: the first requant 3 cycles (its sum in a stage of its own), the last 3 (also for a
    value wider than a multiplier's 18 bits): 6 cycles for ``O``, ``H`` and ``F``, 3 for
    ``EMBED`` and the others (``H`` too, where it leaves early); throughput one value per cycle.
    """

    def __init__(self, model, bounds):
        r, b = model.requant, bounds
        # A stage that skips a requant has a rule there all the same (the rules are indexed by
        # stage): one that makes 0, so that it widens neither the unit's output nor what follows.
        unused = Rule(0, 0, saturate=False)
        # Where ``r_hid`` only shifts (a trained model's (1, 3)) the hidden stage's two rules
        # are one: it then leaves after the first requant, three cycles sooner. So it does
        # where r_hid's results on the ReLU's range take few entries (a random model's): the
        # first requant applies r_hid by a table of them, in its last stage.
        hidden_first, hidden_last = (hidden_rules(model) + [unused])[:2]
        relu = hidden_first.result_bound(b["acc_h"])
        self.hidden_by_table = hidden_last is not unused and \
            ResultTable.entries(relu, hidden_last) <= ResultTable.LIMIT
        followed_by = [hidden_last if self.hidden_by_table and s == Stage.H else None for s in Stage]
        if self.hidden_by_table:
            hidden_last = unused
        first = {
            Stage.EMBED: unused, Stage.Q: Rule.to8(r["M_q"]), Stage.K: Rule.to8(r["M_k"]),
            Stage.V: Rule.to8(r["M_v"]), Stage.O: Rule.rq(r["M_o"]),
            Stage.H: hidden_first, Stage.F: Rule.rq(r["M_f"]),
        }
        last = {
            Stage.EMBED: Rule.to8(r["r_qkv"]), Stage.Q: unused, Stage.K: unused,
            Stage.V: unused, Stage.O: Rule.to8(r["r_ffn"]), Stage.H: hidden_last,
            Stage.F: Rule.to8(r["r_out"]),
        }
        # The stages that leave after the first requant.
        self.early = (Stage.Q, Stage.K, Stage.V) + ((Stage.H,) if hidden_last is unused else ())
        residual_rules = {
            Stage.EMBED: (None, "x"), Stage.O: ("x", "s1"), Stage.F: ("s1", None),
        }
        stages = list(Stage)
        # Each rule's input range is its own product's: the results' widths follow from them.
        # EMBED's x passes through the epilogue's input on its way to the residual.
        first_in = {Stage.EMBED: b["x"], Stage.Q: b["acc_q"], Stage.K: b["acc_k"], Stage.V: b["acc_v"],
                    Stage.O: b["acc_o"], Stage.H: b["acc_h"], Stage.F: b["acc_f"]}
        # One column more than any vector has: a value that is only there to fill a word
        # (see Engine) goes to this scratch column, so that it never overwrites a stored one.
        self.scratch = max(model.d_model, model.d_ff)
        columns = self.scratch + 1
        # The first requant starts from the engine's routed slice, a register. The last one's
        # input is chosen between the first's output and the routed slice (for EMBED), so it
        # registers its input: in its multipliers' own operand registers. (Without them, the
        # route from the first's output into a far DSP block, then the product, took 11.5 ns.)
        stored = {"x": b["x"], "s1": b["s1"]}
        adds = {s: stored[residual_rules[s][0]] if residual_rules.get(s, (None,))[0] else None for s in stages}
        middle_rules = [last[s] for s in stages]
        # The first requant carries, beside each value's column, the last requant's multiplier
        # for it: looked up at the input, it reaches the last requant's multiplier from a
        # register, not through a table of the rules (a critical path).
        carried = data.StructLayout({"column": range(columns), "multiplier": signed(multiplier_bits(middle_rules))})
        self.first = Requant([first_in[s] for s in stages], [first[s] for s in stages], tag_shape=carried,
                             registered_input=True, addend_bounds=[adds[s] for s in stages],
                             multiplier_input=True, sum_stage=True, followed_by=followed_by)
        middle_bound = _union(b["x"], b["s1"], b["s2"], b["relu"], b["q"], b["k"], b["v"], self.first.out_bound)
        self.residual = Residual(stored, [residual_rules.get(s, (None, None)) for s in stages], columns,
                                 middle_bound.bits)
        self.last = Requant(middle_bound, middle_rules, tag_shape=range(columns),
                            multiplier_input=True)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "value": signed(self.first.in_bits), "tag": range(columns), "select": range(len(stages)),
                "multiplier": signed(self.first.multiplier_bits)}))),
            "o": Out(self.last.o.signature),
        })

    def first_multiplier(self, select):
        """The first requant's multiplier for the stage ``select``, for the input's ``multiplier``:
        looked up where the stage is decided, it reaches the multiplier from the register the
        input must come from (not through a table of the rules: a critical path)."""
        return self.first.multiplier_of(select)

    def elaborate(self, platform):
        m = Module()
        m.submodules.first = self.first
        m.submodules.residual = self.residual
        m.submodules.last = self.last
        first, residual, last = self.first, self.residual, self.last

        def carry(into, source, tag=None):
            # Field by field: the units' values differ in width.
            return [into.value.eq(source.value), into.tag.eq(source.tag if tag is None else tag),
                    into.select.eq(source.select)]

        # The input: EMBED to the last requant, every other stage to the first, with the
        # residual's entry that it adds.
        embed_in = self.i.payload.select == Stage.EMBED
        m.d.comb += [
            residual.lookup_tag.eq(self.i.payload.tag),
            residual.lookup_select.eq(self.i.payload.select),
            *carry(first.i.payload, self.i.payload, self.i.payload.tag),
            first.i.payload.tag.multiplier.eq(last.multiplier_of(self.i.payload.select)),
            first.i.payload.multiplier.eq(self.i.payload.multiplier),
            first.i.payload.addend.eq(residual.addend),
            first.i.valid.eq(self.i.valid & ~embed_in),
        ]
        # The first requant's output: the early stages out, the others on to the last requant.
        select = first.o.payload.select
        leaves = Cat(select == stage for stage in self.early).any()
        m.d.comb += first.o.ready.eq(Mux(leaves, self.o.ready, last.i.ready))
        with m.If(first.o.valid):
            m.d.comb += [*carry(last.i.payload, first.o.payload, first.o.payload.tag.column),
                         last.i.payload.multiplier.eq(first.o.payload.tag.multiplier), last.i.valid.eq(~leaves)]
        with m.Else():
            m.d.comb += [*carry(last.i.payload, self.i.payload), last.i.valid.eq(self.i.valid & embed_in),
                         last.i.payload.multiplier.eq(last.multiplier_of(Stage.EMBED))]
        m.d.comb += self.i.ready.eq(Mux(embed_in, last.i.ready & ~first.o.valid, first.i.ready))
        # The residual stores x and s1 as they enter the last requant.
        m.d.comb += [
            residual.store_tag.eq(last.i.payload.tag),
            residual.store_select.eq(last.i.payload.select),
            residual.store_value.eq(last.i.payload.value),
            residual.store_valid.eq(last.i.valid & last.i.ready),
        ]
        # Out: of the two sources, at most one holds a value (all in flight are one stage's).
        with m.If(first.o.valid & leaves):
            m.d.comb += [*carry(self.o.payload, first.o.payload, first.o.payload.tag.column), self.o.valid.eq(1)]
        with m.Else():
            m.d.comb += [*carry(self.o.payload, last.o.payload), self.o.valid.eq(last.o.valid)]
        m.d.comb += last.o.ready.eq(self.o.ready & ~(first.o.valid & leaves))
        return m
