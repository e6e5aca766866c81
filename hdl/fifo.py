from amaranth.hdl import Module, Mux, Shape, Signal
from amaranth.lib import memory, stream, wiring
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
    """A first-in first-out queue with ``stream`` ports of any payload shape, in LUT RAM.

    The queue's readiness does not depend on its consumer's in the same cycle, so it also
    breaks combinational paths between producer and consumer.

    Ports
    -----
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``
    level : ``Out(range(depth + 1))``, the items queued.

    Latency 1 cycle (the head is read from LUT RAM without a register), throughput one item per
    cycle. With ``fall_through``, an item that arrives at an empty queue whose consumer is ready
    passes straight through, in the same cycle; the input's readiness still depends only on the
    queue. With ``registered_head``, the head leaves from a register, at the same latency: the
    item after it is read ahead (or taken from the input, where that is the one written), so
    that the consumer's decisions on the head do not start with a LUT RAM's read.
    """

    def __init__(self, shape, depth, *, fall_through=False, registered_head=False):
        self.shape, self.depth, self.fall_through = shape, depth, fall_through
        self.registered_head = registered_head
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape)),
                          "level": Out(range(depth + 1))})

    def elaborate(self, platform):
        m = Module()
        # Its memory is LUT RAM whatever its size, as the plan counts it (plan.plan.MemoryPlan).
        m.submodules.storage = storage = memory.Memory(shape=Shape.cast(self.shape).width, depth=self.depth,
                                                       init=[], attrs={"ram_style": "distributed"})
        write, read = storage.write_port(), storage.read_port(domain="comb")
        level = self.level
        produce = Signal(range(self.depth))
        consume = Signal(range(self.depth))
        nonempty, room = Signal(), Signal()
        m.d.comb += [room.eq(level != self.depth), nonempty.eq(level != 0)]
        passing = Signal()  # the queue is empty: the input is the output
        if self.fall_through:
            m.d.comb += passing.eq(~nonempty)
        writing = self.i.valid & ~(passing & self.o.ready) & room
        reading = self.o.ready & ~passing & nonempty

        def following(pointer):
            if self.depth == 1 << len(pointer):
                return pointer + 1
            return Mux(pointer == self.depth - 1, 0, pointer + 1)
        head = read.data
        if self.registered_head:
            # The item at `consume`, in a register: read ahead as the head leaves (the input
            # itself where it is written behind a last item), or written into an empty queue.
            head = Signal(self.shape)
            with m.If(reading):
                m.d.sync += head.eq(Mux(level == 1, self.i.payload, read.data))
            with m.Elif(~nonempty):
                m.d.sync += head.eq(self.i.payload)
        m.d.comb += [
            write.addr.eq(produce), write.data.eq(self.i.payload), write.en.eq(writing),
            read.addr.eq(following(consume) if self.registered_head else consume),
            self.i.ready.eq(room),
            self.o.payload.eq(Mux(passing, self.i.payload, head)),
            self.o.valid.eq(Mux(passing, self.i.valid, nonempty)),
        ]
        with m.If(writing):
            m.d.sync += produce.eq(following(produce))
        with m.If(reading):
            m.d.sync += consume.eq(following(consume))
        with m.If(writing & ~reading):
            m.d.sync += level.eq(level + 1)
        with m.If(reading & ~writing):
            m.d.sync += level.eq(level - 1)
        return m
