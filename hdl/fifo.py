from amaranth.hdl import Module, Shape
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["StreamFIFO"]


class StreamFIFO(wiring.Component):
    """A first-in first-out queue with ``stream`` ports of any payload shape.

    ``amaranth.lib.fifo`` queues carry plain bit vectors; this gives them typed stream ports.
    The queue's readiness does not depend on its consumer's in the same cycle, so it also
    breaks combinational paths between producer and consumer.

    Ports
    -----
    i : ``In(stream.Signature(shape))``
    o : ``Out(stream.Signature(shape))``

    Latency 2 cycles (``SyncFIFOBuffered``), throughput one item per cycle.
    """

    def __init__(self, shape, depth):
        self.shape, self.depth = shape, depth
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.queue = queue = fifo.SyncFIFOBuffered(
            width=Shape.cast(self.shape).width, depth=self.depth)
        m.d.comb += [
            queue.w_data.eq(self.i.payload),
            queue.w_en.eq(self.i.valid),
            self.i.ready.eq(queue.w_rdy),
            self.o.payload.eq(queue.r_data),
            self.o.valid.eq(queue.r_rdy),
            queue.r_en.eq(self.o.ready),
        ]
        return m
