from amaranth.hdl import Module, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .interface import EngineControl, Error, Op

__all__ = ["Sequencer"]


class Sequencer(wiring.Component):
    """The engine's sequencer: commands in, steps started and ended, tokens out, status.

    A step starts the embedding (unless its q, k and v come from a table and it is a prefill
    step: it then needs no x) and the q, k, v source; in each layer, attention starts as soon as
    q is complete, the cache row is written as K, then V, are (a row is written whole: again
    once V is there), and the next layer waits for its q; the step ends when the head's arg-max
    gives the next token, or, for a prefill step, once the last layer's cache row is written
    (every layer below it runs whole: the next one's row needs its output). ``GENERATE`` feeds each token back and starts
    the next step at once; the token waits in an output register.

    Parameters
    ----------
    plan : :class:`plan.Plan`

    Ports
    -----
    cmd, tokens, status : :class:`~.interface.EngineControl`'s, seen from the engine.
    embed : ``Out(stream.Signature(StructLayout({"token", "position"})))``
        A step's start, to the embedding.
    qkv_start : ``Out(stream.Signature(StructLayout({"token", "position", "addressed"})))``
    ahead : ``Out(StructLayout({"valid", "token", "position"}))``
        A step's start, and the step to follow while the head runs, to the q, k, v source.
    have_q, have_k, have_v : ``In(1)``
    query_valid : ``Out(1)``, query_ready : ``In(1)``
        Attention's query handshake (the query itself goes from the source to attention).
    cache_write : ``Out(1)``
        The cache takes the row (K and V as they stand) at ``pos``.
    keys_ready, values_ready : ``Out(1)``
        Attention may read row ``pos``'s K, V.
    head : ``In(stream.Signature(range(vocab)))``
        The arg-max's token.
    pos : ``Out(range(seq_len + 1))``, the position of the step.
    layer : ``Out(range(n_layers))``, the layer whose cache row and query are at hand.
    next_layer : ``Out(1)``, the layer's q, k and v are taken: the source's next are the next layer's.
    """

    def __init__(self, plan):
        self.plan = plan
        model = plan.model
        step = data.StructLayout({"token": range(model.vocab), "position": range(model.seq_len + 1)})
        super().__init__({
            **EngineControl(model.seq_len).flip().members,
            "embed": Out(stream.Signature(step)),
            "qkv_start": Out(stream.Signature(data.StructLayout({
                "token": range(model.vocab), "position": range(model.seq_len + 1), "addressed": 1}))),
            "ahead": Out(data.StructLayout({"valid": 1, "token": range(model.vocab),
                                            "position": range(model.seq_len + 1)})),
            "have_q": In(1), "have_k": In(1), "have_v": In(1),
            "query_valid": Out(1), "query_ready": In(1),
            "cache_write": Out(1),
            "keys_ready": Out(1), "values_ready": Out(1),
            "head": In(stream.Signature(range(model.vocab))),
            "pos": Out(range(model.seq_len + 1)),
            "layer": Out(range(model.n_layers)),
            "next_layer": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        model = self.plan.model
        vocab, seq_len = model.vocab, model.seq_len
        table = self.plan.qkv.table
        layers = model.n_layers

        pos = Signal(range(seq_len + 1))
        layer = Signal(range(layers))
        top = layer == layers - 1  # the last layer
        next_token = Signal(8)
        have_next = Signal()
        remaining = Signal.like(self.cmd.payload.arg)
        error = Signal(3)
        cycles = Signal(32)
        last_cycles = Signal(32)
        steps = Signal(32)
        busy = Signal()
        generating = Signal()
        keys_ready = Signal()
        values_ready = Signal()
        # While the head runs, a table is addressed with the step that would follow it: the
        # arg-max's token at pos + 1. A generated step then finds its row read as it starts.
        heading = Signal()
        following = Signal.like(pos)  # pos + 1, from the cache row's write to the step's end
        m.d.comb += [
            self.pos.eq(pos),
            self.layer.eq(layer),
            self.status.pos.eq(pos),
            self.status.error.eq(error),
            self.status.busy.eq(busy),
            self.status.cycles.eq(last_cycles),
            self.status.steps.eq(steps),
            self.tokens.payload.eq(next_token),
            self.ahead.valid.eq(heading),
            self.ahead.token.eq(self.head.payload),
            self.ahead.position.eq(following),
        ]
        with m.If(keys_ready):
            m.d.comb += self.keys_ready.eq(1)
        with m.If(values_ready):
            m.d.comb += self.values_ready.eq(1)
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

        def start_step(token, position, prefill=False, addressed=False):
            # `addressed`: the table's read port was given this step's address in this cycle.
            m.d.sync += [cycles.eq(1), keys_ready.eq(0), values_ready.eq(0), prefilling.eq(prefill)]
            if layers > 1:
                m.d.sync += layer.eq(0)
            m.d.comb += [
                self.qkv_start.valid.eq(1), self.qkv_start.payload.token.eq(token),
                self.qkv_start.payload.position.eq(position), self.qkv_start.payload.addressed.eq(addressed),
                self.embed.payload.token.eq(token), self.embed.payload.position.eq(position),
                # A prefill step with q, k, v from a table reads its cache row from the table: it needs no x.
                self.embed.valid.eq(~Value.cast(prefill) if table else 1),
            ]

        def row_written():
            # The cache row is complete: the next layer waits for its q, or the head follows,
            # and a table is addressed with the step after it.
            m.d.sync += [values_ready.eq(1), following.eq(pos + 1)]
            if layers == 1:
                m.d.sync += heading.eq(1)
                m.next = "HEAD"
            else:
                with m.If(top):
                    m.next = "HEAD"
                with m.Else():
                    m.d.sync += layer.eq(layer + 1)
                    m.d.comb += self.next_layer.eq(1)
                    m.next = "STEP"

        def end_step():
            m.d.sync += [last_cycles.eq(cycles), pos.eq(pos + 1), steps.eq(steps + 1)]

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
                        m.d.sync += [pos.eq(0), have_next.eq(0), steps.eq(0)]
                    with m.Case(Op.FEED, Op.PREFILL):
                        with m.If(at_end):
                            m.d.sync += error.eq(Error.POSITION)
                        with m.Elif(token_outside):
                            m.d.sync += error.eq(Error.TOKEN)
                        with m.Else():
                            start_step(arg, pos, op == Op.PREFILL)
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
                with m.If(prefilling & top):
                    # V comes last: with it the row is complete, nothing in flight.
                    with m.If(self.have_v):
                        m.next = "PREFILL_ROW"
                with m.Else():
                    # Attention starts as soon as q is complete.
                    m.d.comb += self.query_valid.eq(self.have_q)
                    with m.If(self.have_q & self.query_ready):
                        if layers > 1:
                            # Attention is done with the layer below: its cache row flags start afresh.
                            m.d.sync += [keys_ready.eq(0), values_ready.eq(0)]
                        if table:
                            # K[pos] and V[pos] came with q: the row is written as attention takes
                            # q, and attention may read it from the next cycle.
                            m.d.comb += self.cache_write.eq(1)
                            m.d.sync += keys_ready.eq(1)
                            row_written()
                        else:
                            m.next = "WAIT_KEYS"
            with m.State("PREFILL_ROW"):
                m.d.comb += self.cache_write.eq(1)
                end_step()
                m.d.sync += [have_next.eq(0), busy.eq(0)]
                m.next = "IDLE"
            # The cache takes a row every cycle, written whole: K[pos] goes in as soon as it is
            # complete (V[pos] is not yet: the row is written again once it is). Attention may
            # read the row from the next cycle: it is told then of K (it reads K rows as it issues
            # their group), and of V in the cycle of the write (it reads V rows cycles later).
            with m.State("WAIT_KEYS"):
                with m.If(self.have_k):
                    m.d.comb += self.cache_write.eq(1)
                    m.d.sync += keys_ready.eq(1)
                    m.next = "WAIT_VALUES"
            with m.State("WAIT_VALUES"):
                with m.If(self.have_v):
                    m.d.comb += [self.cache_write.eq(1), self.values_ready.eq(1)]
                    row_written()

            def emit_then_step(token, position, addressed=False):
                # The token goes to the output register; the next step starts at once.
                m.d.sync += token_pending.eq(1)
                with m.If(remaining == 0):
                    m.next = "DRAIN"
                with m.Else():
                    start_step(token, position, addressed=addressed)
                    m.d.sync += remaining.eq(remaining - 1)
                    m.next = "STEP"

            with m.State("HEAD"):
                # A generated token waits for the previous one to have left.
                m.d.comb += self.head.ready.eq(~generating | slot_free)
                with m.If(self.head.valid & self.head.ready):
                    m.d.sync += [next_token.eq(self.head.payload), have_next.eq(1), heading.eq(0)]
                    end_step()
                    with m.If(generating):
                        # The next step's position from a register, not through an adder.
                        emit_then_step(self.head.payload, following, addressed=table)
                    with m.Else():
                        m.d.sync += busy.eq(0)
                        m.next = "IDLE"
            with m.State("EMIT_FIRST"):
                # GENERATE's first token is the last step's.
                with m.If(slot_free):
                    emit_then_step(next_token, pos)
            with m.State("DRAIN"):
                with m.If(slot_free):
                    m.d.sync += [busy.eq(0), generating.eq(0)]
                    m.next = "IDLE"
        return m
