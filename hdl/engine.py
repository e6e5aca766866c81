import dataclasses
import enum

import numpy as np
from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from int8model.bounds import Bound, analyse
from int8model.golden import projections

from .argmax import ArgMax
from .attention import Attention
from .epilogue import Epilogue, Stage, hidden_rules
from .fifo import RegisterSlice, SkidBuffer, StreamFIFO
from .kv_cache import KVCache
from .matvec import MatVec
from .requant import Rule

__all__ = ["Op", "Error", "Engine", "Shape", "DEFAULT_WAYS", "DEFAULT_ATTENTION_ROWS", "ATTENTION_ROWS", "XI_TABLE_BYTES", "xi_table_depth",
           "QKV_TABLE_BYTES", "qkv_table_depth", "qkv_table_fits",
           "lanes_for", "command_layout", "status_layout"]


class Op(enum.IntEnum):
    NEW = 0       # start a new sequence: position 0
    FEED = 1      # run a step for `arg` (a prompt token) at the current position
    GENERATE = 2  # emit the last step's next token, then run `arg − 1` steps feeding each back
    PREFILL = 3   # as FEED, for a prompt token whose next token is not asked for: only K and V


# Elements a cycle between the units: four, as on the 85F, where the seed-size model's 32
# lanes take 96 DSP multipliers and 32 in LUTs (one way), beside attention's 32 and the
# epilogues' (see hdl.build.choose_ways).
DEFAULT_WAYS = 4


# Cache rows a cycle in the attention's two row phases: the first bank's products in DSP
# blocks, the second's in LUTs.
DEFAULT_ATTENTION_ROWS = 2
ATTENTION_ROWS = (1, 2, 4)  # powers of two: the cache banks are addressed by a row's low bits


# A table of xi = to8(EinA[tok] + PinA[pos], r_qkv) for every token and position, when it
# takes at most this many bytes: a step's first product then starts from it, without waiting
# for x to pass through the epilogue (which still stores x for the residual).
XI_TABLE_BYTES = 64 * 1024


def xi_table_depth(model, ways):
    """Words of the xi table: a power-of-two stride per position and per token, so that its
    address is a concatenation of token, position and word."""
    words = -(-model.d_model // ways)
    return model.vocab << ((model.seq_len - 1).bit_length() + (words - 1).bit_length())


# A table of q, K[pos] and V[pos] for every token and position, when it takes at most this many
# bytes: in a one-layer model they depend on the token and the position only (steps 1 and 2),
# so a step reads them in one cycle, and attention starts at once rather than after the QKV
# product. The seed-size model's takes 96 KB, 43 of the 85F's 208 block RAMs.
QKV_TABLE_BYTES = 128 * 1024


def qkv_table_depth(model):
    """Rows of the q, k, v table: a power-of-two stride per token, so that its address is a
    concatenation of token and position."""
    return model.vocab << (model.seq_len - 1).bit_length()


def qkv_table_fits(model):
    """Whether the engine reads q, k and v from a table by default (``QKV_TABLE_BYTES``)."""
    return qkv_table_depth(model) * 3 * model.d_model <= QKV_TABLE_BYTES


def lanes_for(model, ways, share=1):
    """The default lanes: one per column of a d_model-wide product (or of its ``share``-th
    part), rounded up to whole words."""
    columns = -(-model.d_model // share)
    return -(-columns // ways) * ways


@dataclasses.dataclass(frozen=True)
class Shape:
    """How an engine is arranged for a model: what changes its cycles and its resources, never
    its results. ``lanes`` ``None``: :func:`lanes_for`; ``qkv_table`` ``None``: as
    :func:`qkv_table_fits` decides."""
    lanes: int | None = None
    ways: int = DEFAULT_WAYS
    lut_ways: int = 0
    qkv_table: bool | None = None
    hidden_in_lanes: bool = False
    attention_rows: int = DEFAULT_ATTENTION_ROWS

    def resolved(self, model):
        """The same shape with its defaults decided for ``model``."""
        return dataclasses.replace(
            self, lanes=self.lanes or lanes_for(model, self.ways),
            qkv_table=qkv_table_fits(model) if self.qkv_table is None else bool(self.qkv_table))

    def engine(self, model):
        return Engine(model, **dataclasses.asdict(self))


class Error(enum.IntEnum):
    NONE = 0
    TOKEN = 1      # a token outside the vocab
    POSITION = 2   # a step at or past seq_len
    NO_PROMPT = 3  # GENERATE with no step run since NEW
    COUNT = 4      # GENERATE 0


class Matrix(enum.IntEnum):
    QKV = 0
    WO = 1
    W1 = 2
    W2 = 3
    HEAD = 4


def command_layout(seq_len):
    return data.StructLayout({"op": 2, "arg": unsigned(max(8, seq_len.bit_length()))})


def status_layout(seq_len):
    return data.StructLayout({
        "pos": range(seq_len + 1), "error": 3, "busy": 1, "cycles": 32, "steps": 32})


class Engine(wiring.Component):
    """The decode engine: a whole decode step (docs/semantics.md, steps 1–7) in hardware, and generation.

    One sequencer drives five units through a decode step: the embedding ROMs feed the
    :class:`~.epilogue.Epilogue`, whose int8 outputs stream into the :class:`~.matvec.MatVec`
    lanes, whose sums stream back through the epilogue into the next product; q, k and v are
    collected for the :class:`~.kv_cache.KVCache` and the :class:`~.attention.Attention` unit,
    whose context feeds the output projection; the head's logits go into the
    :class:`~.argmax.ArgMax` a whole group of lanes at once. Products overlap: each vector
    streams into the next matrix while it is still leaving the previous one. Vectors move
    ``ways`` elements a cycle, as words: ``ways`` epilogues work side by side, element k of
    every word on epilogue k. Of each MAC lane's ``ways`` multipliers, the last ``lut_ways``
    are built from LUTs (for a part with too few DSP blocks); the results and the timing are
    the same. With ``hidden_in_lanes`` (where ``d_ff`` fits the lanes), the FFN's hidden vector
    never leaves them: W1's sums go through the hidden rules all at once and W2 takes them as
    they stand (MatVec's ``hidden``), with no pass through the epilogues: 9 cycles a token
    fewer for the seed-size model, at the cost of some 13,000 LUT4s and a harder place and route
    (not the default: see the README's Speed section).
    Attention reads ``attention_rows`` cache rows a cycle, from as many banks of the
    cache. Where a table of ``q``, ``K[pos]`` and ``V[pos]`` for every token and position is
    small (``QKV_TABLE_BYTES``, or as ``qkv_table`` says), a step reads them from it and runs
    no QKV product; otherwise, where a table of ``xi`` is small (``XI_TABLE_BYTES``), the first
    product reads its input from that. With either table, ``x`` passes through the epilogue
    only to be stored for the residual. All shapes, weights and tables come from the model.

    Ports
    -----
    cmd : ``In(stream.Signature(command_layout))``
        :class:`Op` and its argument (a token for ``FEED`` and ``PREFILL``, a count for
        ``GENERATE``). A ``PREFILL`` step makes only what later steps read of it, the cache
        row ``K[pos]``, ``V[pos]``: the step ends once V leaves the lanes, with no attention,
        FFN or head, and leaves no next token for ``GENERATE``.
    tokens : ``Out(stream.Signature(8))``
        Each generated token, as it is made, from a register: the next step starts at once,
        and waits only if the previous token has still not been taken when it ends.
    status : ``Out(status_layout)``
        The position of the next step, the last command's :class:`Error`, whether a
        command is running, the cycles of the last step and the steps since ``NEW``.

    A rejected command changes nothing but the error code: the cache and position stay.
    """

    def __init__(self, model, *, lanes=None, ways=DEFAULT_WAYS, lut_ways=0, attention_rows=DEFAULT_ATTENTION_ROWS,
                 qkv_table=None, hidden_in_lanes=False):
        if attention_rows not in ATTENTION_ROWS:
            raise ValueError(f"attention reads 1, 2 or 4 cache rows a cycle, not {attention_rows}")
        self.model = model
        self.bounds = analyse(model)
        self.ways, self.lut_ways, self.attention_rows = ways, lut_ways, attention_rows
        resolved = Shape(lanes, ways, lut_ways, qkv_table, hidden_in_lanes, attention_rows).resolved(model)
        self.qkv_table, self.lanes = resolved.qkv_table, resolved.lanes
        self.xi_table = not self.qkv_table and xi_table_depth(model, ways) * ways <= XI_TABLE_BYTES
        d = model.d_model
        b = self.bounds
        w = model.weights
        # One epilogue per element of a word: they move in step, each on its own column.
        self.epilogues = [Epilogue(model, b) for _ in range(ways)]
        # With `hidden_in_lanes`, the hidden vector never leaves the lanes: W1's sums go through
        # the hidden rules all at once, and W2 takes them as they stand (MatVec's `hidden`).
        if hidden_in_lanes and model.d_ff > self.lanes:
            raise ValueError(f"the hidden vector's {model.d_ff} elements do not fit the {self.lanes} lanes")
        self.hidden_in_lanes = bool(hidden_in_lanes)
        self.matvec = MatVec(
            [np.concatenate([w["Wq"], w["Wk"], w["Wv"]], axis=1), w["Wo"], w["W1"], w["W2"], w["Eq"].T],
            self.lanes, ways=ways, lut_ways=lut_ways, input_bounds=[b["xi"], b["ci"], b["hi"], b["fi"], b["oi"]],
            order=[Matrix.WO, Matrix.W1, Matrix.W2, Matrix.HEAD] if self.qkv_table else list(Matrix),
            whole=Matrix.HEAD,
            hidden=(Matrix.W1, Matrix.W2, hidden_rules(model), b["acc_h"]) if self.hidden_in_lanes else None)
        self.attention = Attention(model, b, ways=ways, rows=attention_rows)
        self.cache = KVCache(d, model.seq_len, banks=attention_rows)
        # The head's logits go to the arg-max a whole group of lanes at once, not a word at a time.
        self.argmax = ArgMax(self.matvec.acc_bits, model.vocab, ways=self.lanes)
        # A whole vector fits in the lanes' input queue: while the lanes still replay one
        # matrix's groups, the first results already flow into the next matrix's input.
        # A word that finds the queue empty and the lanes ready goes straight in.
        self.feed = StreamFIFO(self.matvec.i.payload.shape(), -(-max(d, model.d_ff) // ways),
                               fall_through=True)
        super().__init__({
            "cmd": In(stream.Signature(command_layout(model.seq_len))),
            "tokens": Out(stream.Signature(8)),
            "status": Out(status_layout(model.seq_len)),
        })

    def elaborate(self, platform):
        m = Module()
        model = self.model
        d, vocab, seq_len = model.d_model, model.vocab, model.seq_len
        ways = self.ways
        words = -(-d // ways)  # words of a d-vector
        for k, epilogue in enumerate(self.epilogues):
            m.submodules[f"epilogue{k}"] = epilogue
        epilogues = self.epilogues
        scratch = epilogues[0].scratch
        m.submodules.matvec = matvec = self.matvec
        m.submodules.attention = attention = self.attention
        m.submodules.cache = cache = self.cache
        m.submodules.argmax = argmax = self.argmax
        m.submodules.feed = feed = self.feed
        wiring.connect(m, attention.cache, cache.read)
        wiring.connect(m, feed.o, matvec.i)
        wiring.connect(m, matvec.w, argmax.i)

        # Named copies of the streams out of the units, for benches to watch: in the generated
        # Verilog a unit's own port names are not stable (they give way to its submodules').
        def probe(port, name):
            for field in ("valid", "ready", "payload"):
                copy = Signal.like(getattr(port, field), name=f"probe_{name}_{field}")
                m.d.comb += copy.eq(getattr(port, field))
        for k, epilogue in enumerate(epilogues):
            probe(epilogue.o, f"epilogue{k}")
        probe(attention.o, "attention")
        probe(matvec.o, "matvec")
        probe(matvec.w, "head")
        probe(attention.i, "query")
        probe(cache.write, "cache_write")
        if self.hidden_in_lanes:
            m.d.comb += [Signal(name="probe_hidden_valid").eq(matvec.hidden_valid),
                         Signal.like(matvec.hidden_vector, name="probe_hidden_payload").eq(matvec.hidden_vector)]

        # The epilogues' inputs, decided below, through a register: the decisions are logic
        # on another unit's output, the epilogues start with a multiplier. Before it, a skid
        # buffer, so that the epilogues' readiness stops at its register and does not run on
        # through the routing into the lanes' output and the embedding (the shipped model's
        # critical path on the 85F).
        routed_shape = data.ArrayLayout(epilogues[0].i.payload.shape(), ways)
        m.submodules.routing = routing = SkidBuffer(routed_shape)
        m.submodules.routed = routed = RegisterSlice(routed_shape)
        wiring.connect(m, routing.o, routed.i)

        # -- Embedding: x[e] = EinA[tok][e] + PinA[pos][e], one word of columns per cycle.
        # Each row takes a power of two of words, so that a row's address is a shift of the
        # token or position, not a product.
        row_words = 1 << (words - 1).bit_length()

        def rom(table):
            values = table.tolist()
            bits = Bound(int(table.min()), int(table.max())).bits
            init = []
            for row in values:
                row = row + [0] * (row_words * ways - len(row))
                init += [row[at:at + ways] for at in range(0, len(row), ways)]
            return memory.Memory(shape=data.ArrayLayout(signed(bits), ways), depth=len(init), init=init)
        m.submodules.token_embedding = token_rom = rom(model.embed)
        m.submodules.position_embedding = position_rom = rom(model.positions)
        token_read = token_rom.read_port()        # one cycle of latency
        position_read = position_rom.read_port()  # one cycle of latency
        token_base = Signal(range(vocab * row_words))
        position_base = Signal(range((seq_len + 1) * row_words))
        embed_word = Signal(range(words + 1))
        embed_fetched = Signal()  # the read ports hold the word whose first column is `embed_fetched_column`
        # The read ports' words go through registers before the sum: a block RAM's output
        # is slow (5.8 ns on the 85F, a critical path), and its route then ends in a register.
        embed_held = Signal()     # the registers hold the word whose first column is `embed_tag_column`
        token_held = Signal.like(token_read.data)
        position_held = Signal.like(position_read.data)
        # Columns counted rather than multiplied out of word numbers (a product would take a
        # multiplier, and a far one).
        embed_word_column = Signal(range(words * ways + 1))  # the first column of `embed_word`
        embed_fetched_column = Signal(range(words * ways + 1))
        embed_tag_column = Signal(range(words * ways + 1))
        embedding = Signal()
        # The embedding's words leave through a skid buffer of their own: its readiness is a
        # register beside the embedding's, where the routing's, across the part, took a round
        # trip into the embedding's enables (the 85F's critical path).
        m.submodules.embedded = embedded = SkidBuffer(routed_shape)
        embed_out_valid = Signal()
        embed_advance = Signal()
        m.d.comb += [
            embed_out_valid.eq(embedding & embed_held),
            embed_advance.eq(~embed_out_valid | embedded.i.ready),
            token_read.en.eq(embed_advance),
            position_read.en.eq(embed_advance),
            token_read.addr.eq(token_base + embed_word),
            position_read.addr.eq(position_base + embed_word),
        ]
        with m.If(embedding & embed_advance):
            m.d.sync += [
                embed_fetched.eq(embed_word < words), embed_fetched_column.eq(embed_word_column),
                embed_held.eq(embed_fetched), embed_tag_column.eq(embed_fetched_column),
                token_held.eq(token_read.data), position_held.eq(position_read.data),
            ]
            with m.If(embed_word < words):
                m.d.sync += [embed_word.eq(embed_word + 1), embed_word_column.eq(embed_word_column + ways)]

        # -- xi straight from its table (where it fits), a word a cycle into the lanes, beside
        # x on its way to the residual.
        xi_feeding = Signal()   # words of xi are still to be read
        xi_out_valid = Signal()
        step_token = Signal(range(vocab))  # the token of the step
        xi_word = Signal(range(words + 1))
        xi_fetched = Signal()
        xi_data = Signal(data.ArrayLayout(signed(8), ways))
        xi_advance = Signal()
        if self.xi_table:
            to_xi = Rule.to8(model.requant["r_qkv"])
            pos_bits, word_bits = (seq_len - 1).bit_length(), (row_words - 1).bit_length()
            init = []
            for tok in range(vocab):
                for p in range(1 << pos_bits):
                    row = [0] * (row_words * ways)
                    if p < seq_len:
                        for e in range(d):
                            row[e] = to_xi.apply(int(model.embed[tok][e]) + int(model.positions[p][e]))
                    init += [row[at:at + ways] for at in range(0, len(row), ways)]
            m.submodules.xi_table = xi_rom = memory.Memory(
                shape=data.ArrayLayout(signed(8), ways), depth=len(init), init=init)
            xi_read = xi_rom.read_port()  # one cycle of latency
            m.d.comb += [
                xi_out_valid.eq(xi_feeding & xi_fetched),
                xi_advance.eq(~xi_out_valid | feed.i.ready),
                xi_read.en.eq(xi_advance),
                xi_read.addr.eq(Cat(xi_word[:word_bits], position_base[word_bits:word_bits + pos_bits], step_token)),
                xi_data.eq(xi_read.data),
            ]
            with m.If(xi_feeding & xi_advance):
                m.d.sync += xi_fetched.eq(xi_word < words)
                with m.If(xi_word < words):
                    m.d.sync += xi_word.eq(xi_word + 1)
                with m.Else():
                    m.d.sync += xi_feeding.eq(0)

        # -- Routing between the units. At any time at most one source of each shared input
        # is active: the sequence of a step guarantees it, the priorities below only document it.
        # A word's element k is column `column + k`; an element past its vector only fills the
        # word, and goes to the epilogues' scratch column.
        product = matvec.o.payload
        for k, epilogue in enumerate(epilogues):
            m.d.comb += [
                epilogue.i.valid.eq(routed.o.valid),
                epilogue.i.payload.eq(routed.o.payload[k]),
            ]
        m.d.comb += routed.o.ready.eq(epilogues[0].i.ready)
        # A product's word starts at a multiple of `ways` (MatVec's lanes are one): where that
        # is a power of two, its element k's column is a concatenation, not a carry chain. And
        # with the q, k, v table, QKV never passes the lanes: its columns need no splitting.
        # (This path, from the lanes' output to the routed slice, is the 85F's critical one.)
        ways_bits = (ways - 1).bit_length()
        for k in range(ways):
            into = routing.i.payload[k]
            if ways == 1 << ways_bits:
                column = Cat(Const(k, ways_bits), product.column[ways_bits:])
            else:
                column = product.column + k
            if self.qkv_table:  # QKV never comes: its stage only fills `stage_of`
                qkv_stage, tag = Stage.Q, column
            else:
                qkv_stage = Mux(column < d, Stage.Q, Mux(column < 2 * d, Stage.K, Stage.V))
                qkv_column = Mux(column < d, column, Mux(column < 2 * d, column - d, column - 2 * d))
                tag = Mux(product.matrix == Matrix.QKV, qkv_column, column)
            stage_of = Array([qkv_stage, Stage.O, Stage.H, Stage.F, Stage.F])
            embed_column = embed_tag_column + k
            word = embedded.i.payload[k]
            m.d.comb += [
                word.value.eq(token_held[k] + position_held[k]),
                word.select.eq(Stage.EMBED),
                word.multiplier.eq(0),  # EMBED skips the first requant
                word.tag.eq(Mux(embed_column < d, embed_column, scratch)),
            ]
            with m.If(embedded.o.valid):
                m.d.comb += [routing.i.valid.eq(1), into.eq(embedded.o.payload[k])]
            with m.Else():
                m.d.comb += [
                    routing.i.valid.eq(matvec.o.valid),
                    into.value.eq(product.acc[k]),
                    into.select.eq(stage_of[product.matrix]),
                    into.multiplier.eq(epilogues[k].first_multiplier(stage_of[product.matrix])),
                    into.tag.eq(Mux(k >= product.count, scratch, tag)),
                ]
        m.d.comb += [
            embedded.i.valid.eq(embed_out_valid),
            embedded.o.ready.eq(routing.i.ready),
            matvec.o.ready.eq(routing.i.ready & ~embedded.o.valid),
        ]

        stage = epilogues[0].o.payload.select
        # Taken by the collectors below (q, k, v), or, with the xi table, dropped (EMBED).
        collected = (stage == Stage.Q) | (stage == Stage.K) | (stage == Stage.V)
        if self.xi_table or self.qkv_table:
            collected |= stage == Stage.EMBED
        next_matrix = Array([Const(Matrix.QKV), 0, 0, 0, Const(Matrix.W1), Const(Matrix.W2), Const(Matrix.HEAD)])
        with m.If(attention.o.valid):
            m.d.comb += [
                feed.i.valid.eq(1),
                feed.i.payload.matrix.eq(Matrix.WO),
            ]
            for k in range(ways):
                m.d.comb += feed.i.payload.values[k].eq(attention.o.payload.values[k])
        with m.Elif(xi_out_valid):
            m.d.comb += [
                feed.i.valid.eq(1),
                feed.i.payload.matrix.eq(Matrix.QKV),
                feed.i.payload.values.eq(xi_data),
            ]
        with m.Else():
            m.d.comb += [
                feed.i.valid.eq(epilogues[0].o.valid & ~collected),
                feed.i.payload.matrix.eq(next_matrix[stage]),
            ]
            for k, epilogue in enumerate(epilogues):
                m.d.comb += feed.i.payload.values[k].eq(epilogue.o.payload.value)
        m.d.comb += attention.o.ready.eq(feed.i.ready)
        for epilogue in epilogues:
            m.d.comb += epilogue.o.ready.eq(collected | (feed.i.ready & ~attention.o.valid & ~xi_out_valid))

        # -- q, k and v, collected column by column for the cache and the attention unit.
        q = Signal(data.ArrayLayout(signed(8), d))
        k = Signal(data.ArrayLayout(signed(8), d))
        v = Signal(data.ArrayLayout(signed(8), d))
        have_q, have_k, have_v = Signal(), Signal(), Signal()  # the vector is complete
        vectors = ((Stage.Q, q, have_q), (Stage.K, k, have_k), (Stage.V, v, have_v))
        pos = Signal(range(seq_len + 1))
        table_addressed = Signal()  # the q, k, v table's read port holds this step's address
        # While the head runs, the table is addressed with the step that would follow it: the
        # arg-max's token at pos + 1. A generated step then finds its row read as it starts.
        heading = Signal()
        following = Signal.like(pos)  # pos + 1, while heading
        if self.qkv_table:
            pos_bits = (seq_len - 1).bit_length()
            rows = []
            for tok in range(vocab):
                for p in range(1 << pos_bits):
                    if p < seq_len:
                        _, _, q_row, k_row, v_row = projections(model, tok, p)
                        rows.append({"q": q_row.tolist(), "k": k_row.tolist(), "v": v_row.tolist()})
                    else:
                        rows.append({"q": [0] * d, "k": [0] * d, "v": [0] * d})
            vector = data.ArrayLayout(signed(8), d)
            m.submodules.qkv_table = qkv_rom = memory.Memory(
                shape=data.StructLayout({"q": vector, "k": vector, "v": vector}), depth=len(rows), init=rows,
                attrs={"ram_style": "block", "rom_style": "block"})
            qkv_read = qkv_rom.read_port()  # one cycle of latency
            # The address holds for the whole step, and so does the row: q, k and v are the
            # read port's data, complete from the step's second cycle.
            m.d.comb += [
                qkv_read.addr.eq(Mux(heading, Cat(following[:pos_bits], argmax.o.payload),
                                     Cat(pos[:pos_bits], step_token))),
                q.eq(qkv_read.data.q), k.eq(qkv_read.data.k), v.eq(qkv_read.data.v),
                have_q.eq(table_addressed), have_k.eq(table_addressed), have_v.eq(table_addressed),
            ]
        for way, epilogue in enumerate([] if self.qkv_table else epilogues):
            # Registered, then decoded into registered write enables, one per element of q, k
            # and v: the decode's fan-out to all of them starts from registers, and ends in one.
            out = Signal.like(epilogue.o.payload, name=f"collect{way}")
            arrived = Signal(name=f"collect{way}_valid")
            m.d.sync += [out.eq(epilogue.o.payload), arrived.eq(epilogue.o.valid & collected)]
            value = Signal(signed(8), name=f"collect{way}_value")
            m.d.sync += value.eq(out.value)
            for stage, target, complete in vectors:
                ours = arrived & (out.select == stage)
                write = Signal(d, name=f"collect{way}_{stage.name.lower()}_write")
                last = Signal(name=f"collect{way}_{stage.name.lower()}_last")
                m.d.sync += [write.eq(Mux(ours, 1 << out.tag, 0)), last.eq(ours & (out.tag == d - 1))]
                for e in range(d):
                    with m.If(write[e]):
                        m.d.sync += target[e].eq(value)
                with m.If(last):
                    m.d.sync += complete.eq(1)

        # Attention scores the cached rows as soon as q is there, row pos once K[pos] is
        # written, and waits for the V row before weighing them (q, k, v leave the lanes in
        # that order).
        keys_ready = Signal()
        values_ready = Signal()
        with m.If(keys_ready):
            m.d.comb += attention.keys_ready.eq(1)
        with m.If(values_ready):
            m.d.comb += attention.values_ready.eq(1)
        m.d.comb += [
            cache.write.payload.pos.eq(pos),
            cache.write.payload.k.eq(k),
            cache.write.payload.v.eq(v),
            attention.i.payload.q.eq(q),
            attention.i.payload.pos.eq(pos),
        ]

        # -- The sequencer.
        next_token = Signal(8)
        have_next = Signal()
        remaining = Signal.like(self.cmd.payload.arg)
        error = Signal(3)
        cycles = Signal(32)
        last_cycles = Signal(32)
        steps = Signal(32)
        busy = Signal()
        generating = Signal()
        m.d.comb += [
            self.status.pos.eq(pos),
            self.status.error.eq(error),
            self.status.busy.eq(busy),
            self.status.cycles.eq(last_cycles),
            self.status.steps.eq(steps),
            self.tokens.payload.eq(next_token),
        ]
        op = Signal.like(self.cmd.payload.op)
        arg = Signal.like(self.cmd.payload.arg)
        m.d.sync += cycles.eq(cycles + 1)
        # The output register of generated tokens: free once its token is taken (or being taken).
        token_pending = Signal()
        slot_free = ~token_pending | self.tokens.ready
        m.d.comb += self.tokens.valid.eq(token_pending)
        with m.If(self.tokens.ready):
            m.d.sync += token_pending.eq(0)

        prefilling = Signal()  # the step makes only the cache row

        def start_step(tok, prefill=False, addressed=False):
            # `addressed`: the table's read port was given this step's address in this cycle.
            m.d.sync += [
                token_base.eq(tok * row_words), embed_word.eq(0), embed_word_column.eq(0),
                step_token.eq(tok), xi_feeding.eq(self.xi_table), xi_word.eq(0), xi_fetched.eq(0),
                embed_fetched.eq(0), embed_held.eq(0), cycles.eq(1), keys_ready.eq(0), values_ready.eq(0),
                prefilling.eq(prefill), table_addressed.eq(addressed),
            ]
            if self.qkv_table:
                # A prefill step reads its cache row from the table: it needs no x.
                m.d.sync += embedding.eq(~Value.cast(prefill))
            else:
                m.d.sync += [embedding.eq(1), have_q.eq(0), have_k.eq(0), have_v.eq(0)]

        def row_written():
            # The cache row is complete: the head follows, and the table is addressed with the
            # step after it.
            m.d.sync += [values_ready.eq(1), heading.eq(1), following.eq(pos + 1)]
            m.next = "HEAD"

        def end_step():
            m.d.sync += [
                last_cycles.eq(cycles), pos.eq(pos + 1), position_base.eq(position_base + row_words),
                steps.eq(steps + 1),
            ]

        # The command's checks, judged as it is registered: what decides the next state (and
        # the enables of every register a step starts) is then a register, not a comparison.
        at_end = Signal()       # pos >= seq_len
        token_outside = Signal()  # arg >= vocab
        count_zero = Signal()   # arg == 0
        count_past = Signal()   # pos + arg − 1 > seq_len
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    count = self.cmd.payload.arg
                    m.d.sync += [
                        op.eq(self.cmd.payload.op), arg.eq(count), busy.eq(1),
                        at_end.eq(pos >= seq_len), token_outside.eq(count >= vocab),
                        count_zero.eq(count == 0), count_past.eq(pos + count > seq_len + 1),
                    ]
                    m.next = "CHECK"
            with m.State("CHECK"):
                # Busy from the command's acceptance; idle again here unless a step starts.
                m.d.sync += [error.eq(Error.NONE), busy.eq(0)]
                m.next = "IDLE"
                with m.Switch(op):
                    with m.Case(Op.NEW):
                        m.d.sync += [pos.eq(0), position_base.eq(0), have_next.eq(0), steps.eq(0)]
                    with m.Case(Op.FEED, Op.PREFILL):
                        with m.If(at_end):
                            m.d.sync += error.eq(Error.POSITION)
                        with m.Elif(token_outside):
                            m.d.sync += error.eq(Error.TOKEN)
                        with m.Else():
                            start_step(arg, op == Op.PREFILL)
                            m.d.sync += busy.eq(1)
                            m.next = "STEP"
                    with m.Case(Op.GENERATE):
                        with m.If(~have_next):
                            m.d.sync += error.eq(Error.NO_PROMPT)
                        with m.Elif(count_zero):
                            m.d.sync += error.eq(Error.COUNT)
                        with m.Elif(count_past):
                            m.d.sync += error.eq(Error.POSITION)
                        with m.Else():
                            m.d.sync += [remaining.eq(arg - 1), busy.eq(1), generating.eq(1)]
                            m.next = "EMIT_FIRST"
            with m.State("STEP"):
                m.d.sync += table_addressed.eq(1)
                # Embedding ends once its last column has been taken.
                with m.If(embedding & (embed_word == words) & ~embed_fetched & embed_advance):
                    m.d.sync += embedding.eq(0)
                with m.If(prefilling):
                    # V leaves the lanes last: with it the row is complete, nothing in flight.
                    with m.If(have_v):
                        m.next = "PREFILL_ROW"
                with m.Else():
                    # Attention starts as soon as q is complete.
                    m.d.comb += attention.i.valid.eq(have_q)
                    with m.If(have_q & attention.i.ready):
                        if self.qkv_table:
                            # K[pos] and V[pos] came with q: the row is written as attention takes
                            # q, and attention may read it from the next cycle.
                            m.d.comb += cache.write.valid.eq(1)
                            m.d.sync += keys_ready.eq(1)
                            row_written()
                        else:
                            m.next = "WAIT_KEYS"
            with m.State("PREFILL_ROW"):
                m.d.comb += cache.write.valid.eq(1)
                end_step()
                m.d.sync += [have_next.eq(0), busy.eq(0)]
                m.next = "IDLE"
            # The cache takes a row every cycle, written whole: K[pos] goes in as soon as it is
            # complete (V[pos] is not yet: the row is written again once it is). Attention may
            # read the row from the next cycle: it is told then of K (it reads K rows as it issues
            # their group), and of V in the cycle of the write (it reads V rows cycles later).
            with m.State("WAIT_KEYS"):
                with m.If(have_k):
                    m.d.comb += cache.write.valid.eq(1)
                    m.d.sync += keys_ready.eq(1)
                    m.next = "WAIT_VALUES"
            with m.State("WAIT_VALUES"):
                with m.If(have_v):
                    m.d.comb += [cache.write.valid.eq(1), attention.values_ready.eq(1)]
                    row_written()
            def emit_then_step(token, addressed=False):
                # The token goes to the output register; the next step starts at once.
                m.d.sync += token_pending.eq(1)
                with m.If(remaining == 0):
                    m.next = "DRAIN"
                with m.Else():
                    start_step(token, addressed=addressed)
                    m.d.sync += remaining.eq(remaining - 1)
                    m.next = "STEP"

            with m.State("HEAD"):
                # A generated token waits for the previous one to have left.
                m.d.comb += argmax.o.ready.eq(~generating | slot_free)
                with m.If(argmax.o.valid & argmax.o.ready):
                    m.d.sync += [next_token.eq(argmax.o.payload), have_next.eq(1), heading.eq(0)]
                    end_step()
                    with m.If(generating):
                        emit_then_step(argmax.o.payload, addressed=self.qkv_table)
                    with m.Else():
                        m.d.sync += busy.eq(0)
                        m.next = "IDLE"
            with m.State("EMIT_FIRST"):
                # GENERATE's first token is the last step's.
                with m.If(slot_free):
                    emit_then_step(next_token)
            with m.State("DRAIN"):
                with m.If(slot_free):
                    m.d.sync += [busy.eq(0), generating.eq(0)]
                    m.next = "IDLE"
        return m
