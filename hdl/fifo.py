from amaranth.hdl import Module, Mux, Shape, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["StreamFIFO", "SkidBuffer", "RegisterSlice"]


class RegisterSlice(wiring.Component):
    """A register slice for the forward path: ``o.valid`` and ``o.payload`` leave from registers.

    For a payload worked out by logic (routing decided from the fields of another stream) that
    would otherwise run on, unregistered, into the consumer's first stage. One cycle of latency,
    one item per cycle.

    Ports
    -----
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``
    """

    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.i.ready):
            m.d.sync += [self.o.valid.eq(self.i.valid), self.o.payload.eq(self.i.payload)]
        return m


class SkidBuffer(wiring.Component):
    """A register slice for the ready path: ``i.ready`` comes straight from a register.

    A pipeline whose stages all move on ``~o.valid | o.ready`` chains its consumer's readiness
    through every stage, and on to every stage of its producer: at the width of a datapath
    that is the slowest net of a design. Behind this buffer the producer sees a ready that
    only says whether the buffer's one spare slot is empty. Items that arrive while the
    consumer stalls wait in that slot; valid and payload pass straight through otherwise, so
    the buffer adds no latency.

    Ports
    -----
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``
    """

    def __init__(self, shape):
        self.shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        held = Signal()
        spare = Signal(self.shape)
        m.d.comb += [
            self.i.ready.eq(~held),
            self.o.valid.eq(held | self.i.valid),
            self.o.payload.eq(Mux(held, spare, self.i.payload)),
        ]
        with m.If(held):
            with m.If(self.o.ready):
                m.d.sync += held.eq(0)
        with m.Elif(self.i.valid & ~self.o.ready):
            m.d.sync += [held.eq(1), spare.eq(self.i.payload)]
        return m


class StreamFIFO(wiring.Component):
    """A first-in first-out queue with ``stream`` ports of any payload shape.

    ``amaranth.lib.fifo`` queues carry plain bit vectors; this gives them typed stream ports.
    The queue's readiness does not depend on its consumer's in the same cycle, so it also
    breaks combinational paths between producer and consumer.

    Ports
    -----
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``

    Latency 1 cycle (``SyncFIFO``: the head is read from distributed RAM without a register),
    throughput one item per cycle. With ``fall_through``, an item that arrives at an empty
    queue whose consumer is ready passes straight through, in the same cycle; the input's
    readiness still depends only on the queue.
    """

    def __init__(self, shape, depth, *, fall_through=False):
        self.shape, self.depth, self.fall_through = shape, depth, fall_through
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.queue = queue = fifo.SyncFIFO(
            width=Shape.cast(self.shape).width, depth=self.depth)
        passing = Signal()  # the queue is empty: the input is the output
        if self.fall_through:
            m.d.comb += passing.eq(~queue.r_rdy)
        m.d.comb += [
            queue.w_data.eq(self.i.payload),
            queue.w_en.eq(self.i.valid & ~(passing & self.o.ready)),
            self.i.ready.eq(queue.w_rdy),
            self.o.payload.eq(Mux(passing, self.i.payload, queue.r_data)),
            self.o.valid.eq(Mux(passing, self.i.valid, queue.r_rdy)),
            queue.r_en.eq(self.o.ready & ~passing),
        ]
        return m
