from amaranth.hdl import Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import Out

from .fanout import global_net, replicas
from .fifo import StreamFIFO
from .matvec import MatVec
from .product import tree_sum
from .requant import ConstantRequant

__all__ = ["HiddenMatVec"]


class HiddenMatVec(MatVec):
    """:class:`~.matvec.MatVec` with two matrices in a chain kept inside the lanes,
    ``second · rules(first · x)`` (the FFN's W1 and W2, ``plan.hidden``).

    The first's sums, a whole group at once, go through the rule chain in LUT logic
    (:class:`~.requant.ConstantRequant`) into one operand register per lane; the second then
    takes that vector as it stands, lane ``l`` multiplying its element ``l`` by the weights of
    row ``l`` in each of its ``ways`` multipliers, a word of output columns a cycle, each
    column's sum across the lanes added up in a tree. The hidden vector never leaves the
    lanes, and the second product's first word leaves while it would otherwise still be
    streaming in. Its vector comes on ``i`` as the first's (the first's sums do not leave); the
    second follows the first in the plan's order, and comes on ``i`` never. Its sums leave on
    ``o`` through a queue with room for all of them, behind the output buffer's; the first's
    next vector waits until they have left. The first's columns and the second's rows fit the
    lanes.

    Ports, beside :class:`~.matvec.MatVec`'s
    -----------------------------------------
    hidden_valid : ``Out(1)``, hidden_vector : ``Out(ArrayLayout(signed(8), lanes))``
        The hidden vector, lane l's element l, in the one cycle ``hidden_valid`` says it is
        made: for observers, nothing waits on them.

    Latency: as :class:`~.matvec.MatVec`'s; the second's first word leaves
    ``plan.hidden.latency`` cycles after the first's last input word.
    """

    def __init__(self, plan, weights=None, *, loadable=False):
        if plan.hidden is None:
            raise ValueError("a HiddenMatVec's plan has a hidden pair")
        if loadable:
            raise ValueError("the hidden pair's rules are constants: a loadable build has none")
        self.hidden = plan.hidden
        super().__init__(plan, weights)

    def _extra_ports(self):
        # The hidden vector, for observers (it goes nowhere else): valid in the cycle it is made.
        return {"hidden_valid": Out(1), "hidden_vector": Out(data.ArrayLayout(signed(8), self.plan.lanes))}

    def _flag_fields(self):
        return {"stationary": 1}  # a word of the second of the pair

    def _issue_setup(self, m, s):
        hidden = self.hidden
        s.inner = Signal()         # the second is being issued, after `waiting` idle cycles
        s.hidden_ahead = Signal()  # the second's words are still in the lanes or the output queue (a register)
        # Each lane's sum of the first, through the rules in LUT logic, free-running: what the
        # second's lane multiplies (the register holds until the next such sum).
        s.hidden_sums = [Signal(signed(self.acc_bits), name=f"hidden{lane}") for lane in range(self.lanes)]
        requants = [ConstantRequant(m, s.hidden_sums[lane], hidden.bound, hidden.rules, enable=1, name=f"hidden{lane}")
                    for lane in range(self.lanes)]
        s.hidden_vector = [requant.result for requant in requants]
        s.waiting = Signal(range(hidden.lead + 1))
        s.blocked = (s.expected == hidden.first) & s.hidden_ahead  # the first waits for the second's last words
        # replay | inner, a register of its own, so that the input's valid meets one decision
        # on its way to the issue (it comes from the epilogue through the feed queue).
        s.internal = Signal()

    def _issue_control(self, m, s):
        m.d.comb += [self.i.ready.eq(s.advance & ~s.internal & (~s.starting | (s.as_expected & ~s.blocked))),
                     s.issue.eq(Mux(s.internal, s.advance & (~s.inner | (s.waiting == 0)),
                                    self.i.valid & self.i.ready))]

    def _issue_updates(self, m, s):
        first = self.hidden.first
        s.out_of_order &= ~s.inner
        with m.If(s.inner & s.advance & (s.waiting != 0)):
            m.d.sync += s.waiting.eq(s.waiting - 1)
        with m.If(s.issue):
            with m.If(s.final_step & s.final_group):
                # The first's last word: the second's follow, once the vector is made.
                m.d.sync += [s.inner.eq(s.current == first), s.waiting.eq(self.hidden.lead)]
            with m.If(s.final_step):
                with m.If(s.final_group):
                    m.d.sync += s.internal.eq(s.current == first)
                with m.Else():
                    m.d.sync += s.internal.eq(1)
            with m.Elif(s.inner):
                m.d.sync += s.col_base.eq(s.col_base + self.ways)  # the second's words are words of columns

    def _issued_count(self, m, s, count):
        second = self.hidden.second
        inner_tail = self.plan.cols[second] - (self.plan.steps[second] - 1) * self.ways
        m.d.comb += s.issued.stationary.eq(s.inner)
        return Mux(s.inner, Mux(s.final_step, inner_tail, self.ways), count)

    def _stage_operands(self, m, s):
        # Whether the operands are the hidden vector's: a copy per REPLICA_LANES lanes too.
        s.stationary = replicas(unsigned(1), s.copies, "staged_stationary")
        with m.If(s.moving):
            m.d.sync += [copy.eq(s.read.stationary) for copy in s.stationary]

    def _element(self, m, s, lane, element):
        return Mux(s.stationary[lane // self.REPLICA_LANES], s.hidden_vector[lane], element)

    def _finishing(self, m, s):
        # A group's last word of the first goes to the hidden sums, which are always free; a
        # word of the second to the column sums, and never stalls.
        first = self.hidden.first
        s.next_stationary = Mux(s.advance, s.operands.stationary, s.multiplied.stationary)
        s.finishing = s.multiplied.valid & s.multiplied.last & ~s.multiplied.stationary & \
            (s.multiplied.matrix != first)
        s.next_ends = s.next_valid & s.next_last & ~s.next_stationary
        s.next_finishing = s.next_ends & (s.next_matrix != first)

    def _room(self, m, s, next_out_free):
        # Sums for `o` also wait for the second's words ahead of them, which leave first.
        return next_out_free & (~s.hidden_ahead | (s.next_matrix == self.whole if self.whole is not None else 0))

    def _accumulates(self, m, s, next_advance):
        return next_advance & s.next_valid & ~s.next_last & ~s.next_stationary

    def _lane_sums(self, m, s, lane, result):
        if lane == 0:
            s.load_hidden = Signal()  # the first's group ends: its sums go to the hidden sums
            m.d.sync += s.load_hidden.eq(s.next_ends & (s.next_matrix == self.hidden.first))
            s.loading_hidden = global_net(m, s.platform, s.load_hidden, "lanes_load_hidden")
        with m.If(s.loading_hidden):
            m.d.sync += s.hidden_sums[lane].eq(result)

    def _after_lanes(self, m, s):
        made = s.loading_hidden
        for stage in range(self.hidden.lead - 1):  # the sums' register, then the rules' stages
            later = Signal(name=f"hidden_made{stage}")
            m.d.sync += later.eq(made)
            made = later
        m.d.comb += [self.hidden_valid.eq(made),
                     *(self.hidden_vector[lane].eq(value) for lane, value in enumerate(s.hidden_vector))]
        self._column_sums(m, s)

    def _column_sums(self, m, s):
        """Each column's sum of the second across the lanes, a tree of registers
        ``COLUMN_FAN_IN`` terms each, from the products as they leave the pipeline's last
        stage (then free-running: its words never wait on a stalled lane), into a queue with
        room for a whole vector; on `o`, the output buffer's sums first (they are older)."""
        ways, second = self.ways, self.hidden.second
        words = self.plan.steps[second]
        fan_in = self.plan.COLUMN_FAN_IN
        word = data.StructLayout({"valid": 1, "col_base": range(max(self.plan.cols) + self.lanes),
                                  "count": range(self.lanes + 1), "last": 1})
        sums = [list(terms) for terms in s.way_terms]
        multiplied = s.multiplied
        tag = Signal(word, name="column_word0")
        m.d.sync += [tag.valid.eq(multiplied.valid & multiplied.stationary & s.moving),
                     tag.col_base.eq(multiplied.col_base), tag.count.eq(multiplied.count),
                     tag.last.eq(multiplied.last)]
        for stage in range(self.hidden.column_stages):
            for k in range(ways):
                groups = [sums[k][at:at + fan_in] for at in range(0, len(sums[k]), fan_in)]
                registers = [Signal(signed(self.acc_bits), name=f"column{k}_sum{stage}_{at}")
                             for at in range(len(groups))]
                m.d.sync += [register.eq(tree_sum(group)) for register, group in zip(registers, groups)]
                sums[k] = registers
            if stage:
                later = Signal(word, name=f"column_word{stage}")
                m.d.sync += later.eq(tag)
                tag = later
        m.submodules.columns = queue = StreamFIFO(self.o.payload.shape(), words, fall_through=True)
        m.d.comb += [
            queue.i.valid.eq(tag.valid),
            queue.i.payload.column.eq(tag.col_base),
            queue.i.payload.count.eq(tag.count),
            queue.i.payload.matrix.eq(second),
            queue.i.payload.last.eq(tag.last),
            *(queue.i.payload.acc[k].eq(sums[k][0]) for k in range(ways)),
        ]
        output = s.output
        # The older sums first: the output buffer's, then the queue's.
        with m.If(output.o.valid):
            m.d.comb += [self.o.valid.eq(1), self.o.payload.eq(output.o.payload), output.o.ready.eq(self.o.ready)]
        with m.Else():
            m.d.comb += [self.o.valid.eq(queue.o.valid), self.o.payload.eq(queue.o.payload),
                         queue.o.ready.eq(self.o.ready)]
        # The second's words issued and not yet taken: a first's vector waits for none to be
        # left. Counted, and judged, from registers (the input's readiness depends on it).
        outstanding = Signal(range(words + 1))
        left = ~output.o.valid & queue.o.valid & self.o.ready
        counted = outstanding + (s.inner & s.advance & (s.waiting == 0)) - left
        m.d.sync += [outstanding.eq(counted), s.hidden_ahead.eq(counted != 0)]
