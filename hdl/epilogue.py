from amaranth.hdl import Cat, Module, Mux, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from plan.schedule import Stage

from .requant import Requant
from .residual import Residual

__all__ = ["Epilogue"]


class Epilogue(wiring.Component):
    """Everything between one matrix product and the next: requant and residual, requant.

    A value enters with its :class:`Stage` (``select``: of a deep model's layer l, ``7 · l +``
    its stage, :attr:`plan.schedule.StagePlan.select`) and column (``tag``) and leaves as the
    int8 input of the next product (or a q, k, v element), after two requants in a chain:

    1. :class:`Requant` by the stage's multiplier (``M_q`` … ``M_f``; ReLU for ``M_h``),
       adding the residual's entry after the shift: ``s1 = x + rq(acc, M_o)``,
       ``s2 = s1 + rq(acc, M_f)``;
    2. :class:`Requant` to int8 by ``r_qkv``, ``r_ffn``, ``r_hid`` or ``r_out``.

    Between them the :class:`Residual` stores ``x`` and ``s1`` as they pass.
    Its plan (:class:`plan.units.EpiloguePlan`) holds the rules of each stage, from the step's
    table (:mod:`plan.schedule`), and every width, from the model's bounds. The tag ``scratch``
    (one past the widest vector) names no column: what is stored there is never read for a
    real one.

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"value", "tag", "select", "multiplier"})))``
    o : ``Out(stream.Signature(StructLayout({"value", "tag", "select"})))``, ``value`` int8.

    A stage skips the units it has nothing to do in: ``EMBED`` enters at the second requant,
    ``Q``, ``K`` and ``V`` leave after the first, and so does ``H`` where ``r_hid`` only
    shifts (its two rules are then one, see :meth:`plan.arithmetic.Rule.then`) or where the first requant
    applies it by a table of its results. Of the values in flight at any time, all
    belong to one stage (a decode step makes each stage's values from the previous stage's),
    so the paths never meet.

    Its input must come from registers (in the engine: the routed register slice), with the
    first requant's ``multiplier`` for the value's stage (:meth:`first_multiplier`).

    Latency ``plan.latency(stage)``: the first requant 3 cycles (its sum in a stage of its own),
    the last 3 (also for a value wider than a multiplier's 18 bits): 6 cycles for ``O``, ``H``
    and ``F``, 3 for ``EMBED`` and the others (``H`` too, where it leaves early); throughput
    one value per cycle.
    """

    def __init__(self, plan, rules=None):
        self.plan = plan
        self.early = plan.early
        self.scratch = plan.scratch
        self.loaded = plan.first.loaded
        if self.loaded and rules is None:
            raise ValueError("a loadable build's epilogue reads its rules from the rule registers")
        self.rules = rules
        shift = {"shift": unsigned(plan.first.SHIFT_BITS)} if self.loaded else {}
        # The first requant carries, beside each value's column, the last requant's multiplier
        # (and a loaded rule's shift) for it: looked up at the input, it reaches the last
        # requant's multiplier from a register, not through a table of the rules.
        carried = data.StructLayout({"column": range(plan.columns),
                                     "multiplier": signed(plan.carried_multiplier_bits), **shift})
        self.first = Requant(plan.first, tag_shape=carried)
        self.residual = Residual(plan.residual)
        self.last = Requant(plan.last, tag_shape=range(plan.columns))
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "value": signed(plan.first.in_bits), "tag": range(plan.columns), "select": range(plan.selects),
                "multiplier": signed(plan.first.multiplier_bits), **shift}))),
            "o": Out(self.last.o.signature),
        })

    def first_multiplier(self, select):
        """The first requant's multiplier for the stage ``select``, for the input's ``multiplier``:
        looked up where the stage is decided, it reaches the multiplier from the register the
        input must come from, not through a table of the rules after it."""
        return self.rules.first(select)[0] if self.loaded else self.first.multiplier_of(select)

    def first_shift(self, select):
        """A loaded rule's shift, for the input's ``shift``, looked up as the multiplier is."""
        return self.rules.first(select)[1]

    def _last_rule(self, select):
        """The last requant's multiplier of stage ``select`` and, loaded, its shift."""
        if self.loaded:
            return self.rules.last(select)
        return self.last.multiplier_of(select), None

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
        last_multiplier, last_shift = self._last_rule(self.i.payload.select)
        embed_multiplier, embed_shift = self._last_rule(Stage.EMBED)
        m.d.comb += [
            residual.lookup_tag.eq(self.i.payload.tag),
            residual.lookup_select.eq(self.i.payload.select),
            *carry(first.i.payload, self.i.payload, self.i.payload.tag),
            first.i.payload.tag.multiplier.eq(last_multiplier),
            first.i.payload.multiplier.eq(self.i.payload.multiplier),
            first.i.payload.addend.eq(residual.addend),
            first.i.valid.eq(self.i.valid & ~embed_in),
        ]
        if self.loaded:  # after the tag's whole assignment
            m.d.comb += [first.i.payload.shift.eq(self.i.payload.shift), first.i.payload.tag.shift.eq(last_shift)]
        # The first requant's output: the early stages out, the others on to the last requant.
        select = first.o.payload.select
        leaves = Cat(select == stage for stage in self.early).any()
        m.d.comb += first.o.ready.eq(Mux(leaves, self.o.ready, last.i.ready))
        with m.If(first.o.valid):
            m.d.comb += [*carry(last.i.payload, first.o.payload, first.o.payload.tag.column),
                         last.i.payload.multiplier.eq(first.o.payload.tag.multiplier), last.i.valid.eq(~leaves)]
            if self.loaded:
                m.d.comb += last.i.payload.shift.eq(first.o.payload.tag.shift)
        with m.Else():
            m.d.comb += [*carry(last.i.payload, self.i.payload), last.i.valid.eq(self.i.valid & embed_in),
                         last.i.payload.multiplier.eq(embed_multiplier)]
            if self.loaded:
                m.d.comb += last.i.payload.shift.eq(embed_shift)
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
