"""Where a step's q, K[pos] and V[pos] come from: a table, or the QKV product. Two variants of
one interface, :class:`QKVSource`."""

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from plan.schedule import Stage

__all__ = ["QKVSource", "QKVTable", "QKVComputed"]


class QKVSource(wiring.Signature):
    """A q, k, v source, as the source sees its ports, for a :class:`plan.Plan`.

    Members
    -------
    start : ``In(stream.Signature(StructLayout({"token", "position", "addressed"})))``
        A step starts (always ready). ``addressed``: its table row was addressed in this
        cycle (through ``ahead``), so that it is read by the next.
    ahead : ``In(StructLayout({"valid", "token", "position"}))``
        While ``valid``, the step that will follow (while the head finds its token): a table
        reads its row ahead.
    next_layer : ``In(1)``
        A deep model's layer has taken its q, k and v: the next layer's come (the source
        forgets that it has them).
    collect : ``In(stream.Signature(ArrayLayout(StructLayout({"value", "tag", "select"}), ways)))``
        The epilogues' words that go to no product (always ready): q, k and v made by the QKV
        product, one word of ``ways`` elements at a time, element k at column ``tag``.
    xi : ``Out(stream.Signature(StructLayout({"values", "matrix"})))``
        Words of xi for the lanes, where a table of xi has them.
    q, k, v : ``Out(ArrayLayout(signed(8), d_model))``
    have_q, have_k, have_v : ``Out(1)``
        Each vector is complete (and stays so until the next start).
    """

    def __init__(self, plan, collected_layout, lanes_input_layout):
        d = plan.model.d_model
        vector = data.ArrayLayout(signed(8), d)
        super().__init__({
            "start": In(stream.Signature(data.StructLayout({
                "token": range(plan.model.vocab), "position": range(plan.model.seq_len + 1), "addressed": 1}))),
            "ahead": In(data.StructLayout({
                "valid": 1, "token": range(plan.model.vocab), "position": range(plan.model.seq_len + 1)})),
            "collect": In(stream.Signature(data.ArrayLayout(collected_layout, plan.shape.ways))),
            "next_layer": In(1),
            "xi": Out(stream.Signature(lanes_input_layout)),
            "q": Out(vector), "k": Out(vector), "v": Out(vector),
            "have_q": Out(1), "have_k": Out(1), "have_v": Out(1),
        })


class QKVTable(wiring.Component):
    """q, K[pos] and V[pos] read from a table of every token and position (``plan.qkv``): in a
    one-layer model they depend on the token and the position only (docs/semantics.md, steps 1
    and 2). The row is addressed by the step's token above its position's bits, or, ahead of a
    step, by the one that will follow; it holds for the whole step, and so do q, k and v, the
    read port's data, complete from the cycle after the row is addressed.

    ``rows``: the table's rows (``plan.contents``), or ``None`` (zero).
    """

    def __init__(self, plan, collected_layout, lanes_input_layout, rows=None):
        self.plan, self.rows = plan, rows
        super().__init__(QKVSource(plan, collected_layout, lanes_input_layout))

    def elaborate(self, platform):
        m = Module()
        plan = self.plan
        d, pos_bits = plan.model.d_model, plan.qkv.pos_bits
        vector = data.ArrayLayout(signed(8), d)
        m.submodules.table = table = memory.Memory(
            shape=data.StructLayout({"q": vector, "k": vector, "v": vector}), depth=plan.qkv.table_depth,
            init=self.rows or [], attrs={"ram_style": "block", "rom_style": "block"})
        read = table.read_port()  # one cycle of latency
        token = Signal(range(plan.model.vocab))
        position = Signal(range(plan.model.seq_len + 1))
        addressed = Signal()  # the read port holds this step's row
        m.d.comb += [self.start.ready.eq(1), self.collect.ready.eq(1)]
        with m.If(self.start.valid):
            m.d.sync += [token.eq(self.start.payload.token), position.eq(self.start.payload.position),
                         addressed.eq(self.start.payload.addressed)]
        with m.Else():
            m.d.sync += addressed.eq(1)
        m.d.comb += [
            read.addr.eq(Mux(self.ahead.valid, Cat(self.ahead.position[:pos_bits], self.ahead.token),
                             Cat(position[:pos_bits], token))),
            self.q.eq(read.data.q), self.k.eq(read.data.k), self.v.eq(read.data.v),
            self.have_q.eq(addressed), self.have_k.eq(addressed), self.have_v.eq(addressed),
        ]
        return m


class QKVComputed(wiring.Component):
    """q, K[pos] and V[pos] made by the QKV product (docs/semantics.md, step 2), collected
    column by column as they leave the epilogues; the product's input xi read from a table of
    every token and position where the plan has one (``plan.qkv.xi_table``), a word a cycle
    into the lanes (beside x on its way to the residual), else made by the epilogues.

    ``xi_words``: the xi table's words (``plan.contents``), or ``None`` (zero).
    """

    def __init__(self, plan, collected_layout, lanes_input_layout, xi_words=None):
        self.plan, self.xi_words = plan, xi_words
        super().__init__(QKVSource(plan, collected_layout, lanes_input_layout))

    def elaborate(self, platform):
        m = Module()
        plan = self.plan
        d, ways = plan.model.d_model, plan.shape.ways
        m.d.comb += [self.start.ready.eq(1), self.collect.ready.eq(1)]

        if plan.qkv.xi_table:
            self._xi(m)

        # Registered, then decoded into registered write enables, one per element of q, k and
        # v: the decode's fan-out to all of them starts from registers, and ends in one. A
        # word's stage is the epilogue's select: a deep model's layers each have a Q, K and V.
        vectors = ((Stage.Q, self.q, self.have_q), (Stage.K, self.k, self.have_k), (Stage.V, self.v, self.have_v))
        layers = plan.model.n_layers
        for way in range(ways):
            element = self.collect.payload[way]
            out = Signal.like(element, name=f"collect{way}")
            arrived = Signal(name=f"collect{way}_valid")
            m.d.sync += [out.eq(element), arrived.eq(self.collect.valid)]
            value = Signal(signed(8), name=f"collect{way}_value")
            m.d.sync += value.eq(out.value)
            for stage, target, complete in vectors:
                ours = arrived & (out.select == stage if layers == 1 else
                                  out.select.matches(*(len(Stage) * layer + stage for layer in range(layers))))
                write = Signal(d, name=f"collect{way}_{stage.name.lower()}_write")
                last = Signal(name=f"collect{way}_{stage.name.lower()}_last")
                m.d.sync += [write.eq(Mux(ours, 1 << out.tag, 0)), last.eq(ours & (out.tag == d - 1))]
                for e in range(d):
                    with m.If(write[e]):
                        m.d.sync += target[e].eq(value)
                with m.If(last):
                    m.d.sync += complete.eq(1)
        with m.If(self.start.valid | self.next_layer):
            m.d.sync += [self.have_q.eq(0), self.have_k.eq(0), self.have_v.eq(0)]
        return m

    def _xi(self, m):
        plan = self.plan
        words, pos_bits, word_bits = plan.embedding.words, plan.qkv.pos_bits, plan.qkv.word_bits
        m.submodules.xi_table = table = memory.Memory(
            shape=data.ArrayLayout(signed(8), plan.shape.ways), depth=plan.qkv.xi_depth, init=self.xi_words or [],
            attrs={"ram_style": "block", "rom_style": "block"})
        read = table.read_port()  # one cycle of latency
        token = Signal(range(plan.model.vocab))
        position = Signal(range(plan.model.seq_len + 1))
        feeding = Signal()   # words of xi are still to be read
        word = Signal(range(words + 1))
        fetched = Signal()   # the read port holds a word
        advance = Signal()
        m.d.comb += [
            self.xi.valid.eq(feeding & fetched),
            advance.eq(~self.xi.valid | self.xi.ready),
            read.en.eq(advance),
            read.addr.eq(Cat(word[:word_bits], position[:pos_bits], token)),
            self.xi.payload.values.eq(read.data),
            self.xi.payload.matrix.eq(0),  # QKV, the first product
        ]
        with m.If(feeding & advance):
            m.d.sync += fetched.eq(word < words)
            with m.If(word < words):
                m.d.sync += word.eq(word + 1)
            with m.Else():
                m.d.sync += feeding.eq(0)
        with m.If(self.start.valid):
            m.d.sync += [token.eq(self.start.payload.token), position.eq(self.start.payload.position),
                         feeding.eq(1), word.eq(0), fetched.eq(0)]
