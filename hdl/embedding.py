from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .fifo import SkidBuffer
from .loader import connect_load, load_port

__all__ = ["Embedding"]


class Embedding(wiring.Component):
    """The embedding (docs/semantics.md, step 1): ``x = EinA[tok] + PinA[pos]``, ``ways``
    columns a cycle, from two block-RAM tables.

    Each row of a table takes a power of two of words (``plan.row_words``), so that a row's
    address is a shift of the token or the position, not a product.

    Parameters
    ----------
    plan : :class:`plan.units.EmbeddingPlan`
    scratch : int
        The column past every vector (the epilogues'), for the places of a last word past
        ``d_model``.
    token_words, position_words : lists of words (``plan.contents.embedding_words``), or ``None`` (zero)
    loadable : bool
        The tables take a loadable build's words on ``load_token`` and ``load_position``.

    Ports
    -----
    start : ``In(stream.Signature(StructLayout({"token", "position"})))``
        A step's token and position: the embedding restarts with them (always ready).
    o : ``Out(stream.Signature(ArrayLayout(StructLayout({"value", "tag"}), ways)))``
        ``x`` a word at a time, element k of a word at column ``tag`` (``scratch`` past
        ``d_model``), through a skid buffer: its readiness is a register beside the
        embedding's, so the consumer's does not reach into the embedding's enables.

    Latency: the first word 3 cycles after ``start`` (the read, its register, the sum); one word
    a cycle after it.
    """

    def __init__(self, plan, scratch, token_words=None, position_words=None, *, loadable=False):
        self.plan, self.scratch, self.loadable = plan, scratch, loadable
        self.token_words, self.position_words = token_words or [], position_words or []
        self.word_layout = data.ArrayLayout(data.StructLayout({
            "value": signed(plan.x_bound.bits), "tag": range(scratch + 1)}), plan.ways)
        loads = {"load_token": In(load_port(plan.token_depth, plan.ways * plan.token_bits)),
                 "load_position": In(load_port(plan.position_depth, plan.ways * plan.position_bits))}
        super().__init__({
            "start": In(stream.Signature(data.StructLayout({
                "token": range(plan.vocab), "position": range(plan.seq_len + 1)}))),
            "o": Out(stream.Signature(self.word_layout)),
            **(loads if loadable else {}),
        })

    def elaborate(self, platform):
        m = Module()
        plan = self.plan
        d, ways, words, row_words = plan.d_model, plan.ways, plan.words, plan.row_words
        word_bits = (row_words - 1).bit_length()

        def rom(name, words_init, bits, depth):
            # Block RAM, as the plan counts it: a read of one cycle of latency.
            table = memory.Memory(shape=data.ArrayLayout(signed(bits), ways), depth=depth, init=words_init,
                                  attrs={"ram_style": "block", "rom_style": "block"})
            m.submodules[name] = table
            if self.loadable:
                connect_load(m, table, getattr(self, f"load_{name}"))
            return table.read_port()
        token_read = rom("token", self.token_words, plan.token_bits, plan.token_depth)
        position_read = rom("position", self.position_words, plan.position_bits, plan.position_depth)

        token_base = Signal(range(plan.token_depth))
        position_base = Signal(range((plan.seq_len + 1) * row_words))
        embed_word = Signal(range(words + 1))
        embed_fetched = Signal()  # the read ports hold the word whose first column is `embed_fetched_column`
        # The read ports' words go through registers before the sum: a block RAM's output is
        # slow, and its route then ends in a register.
        embed_held = Signal()     # the registers hold the word whose first column is `embed_tag_column`
        token_held = Signal.like(token_read.data)
        position_held = Signal.like(position_read.data)
        # Columns counted rather than multiplied out of word numbers (a product would take a
        # multiplier, and a far one).
        embed_word_column = Signal(range(words * ways + 1))  # the first column of `embed_word`
        embed_fetched_column = Signal(range(words * ways + 1))
        embed_tag_column = Signal(range(words * ways + 1))
        embedding = Signal()

        m.submodules.embedded = embedded = SkidBuffer(self.word_layout)
        wiring.connect(m, embedded.o, wiring.flipped(self.o))
        out_valid = Signal()
        advance = Signal()
        m.d.comb += [
            out_valid.eq(embedding & embed_held),
            advance.eq(~out_valid | embedded.i.ready),
            token_read.en.eq(advance),
            position_read.en.eq(advance),
            token_read.addr.eq(token_base + embed_word),
            position_read.addr.eq(position_base + embed_word),
            embedded.i.valid.eq(out_valid),
        ]
        with m.If(embedding & advance):
            m.d.sync += [
                embed_fetched.eq(embed_word < words), embed_fetched_column.eq(embed_word_column),
                embed_held.eq(embed_fetched), embed_tag_column.eq(embed_fetched_column),
                token_held.eq(token_read.data), position_held.eq(position_read.data),
            ]
            with m.If(embed_word < words):
                m.d.sync += [embed_word.eq(embed_word + 1), embed_word_column.eq(embed_word_column + ways)]
            with m.Elif(~embed_fetched):
                m.d.sync += embedding.eq(0)  # the last word has been taken
        # A start takes precedence over the word in flight.
        m.d.comb += self.start.ready.eq(1)
        with m.If(self.start.valid):
            m.d.sync += [
                token_base.eq(self.start.payload.token << word_bits),
                position_base.eq(self.start.payload.position << word_bits),
                embed_word.eq(0), embed_word_column.eq(0), embed_fetched.eq(0), embed_held.eq(0), embedding.eq(1),
            ]
        for k in range(ways):
            column = embed_tag_column + k
            m.d.comb += [
                embedded.i.payload[k].value.eq(token_held[k] + position_held[k]),
                embedded.i.payload[k].tag.eq(Mux(column < d, column, self.scratch)),
            ]
        return m
