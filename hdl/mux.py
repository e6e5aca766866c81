from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["PriorityMux", "mapped"]


class PriorityMux(wiring.Component):
    """Several streams of one payload shape into one: of those that offer an item, the first
    in order passes, and the others wait.

    For sources of which at most one is active at a time (as a decode step's order makes the
    engine's), the order only decides what would pass if two were; it costs one AND a source
    on the ready path and a multiplexer on the payload.

    Ports
    -----
    i : ``In(stream.Signature(shape))`` each, ``i[0]`` first.
    o : ``Out(stream.Signature(shape))``

    No latency: valid, ready and payload pass through logic.
    """

    def __init__(self, shape, count):
        if count < 1:
            raise ValueError("a multiplexer needs at least one input")
        self.count = count
        super().__init__({
            "i": In(stream.Signature(shape)).array(count),
            "o": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        # From the last to the first: each earlier one's offer takes precedence.
        m.d.comb += [self.o.valid.eq(self.i[-1].valid), self.o.payload.eq(self.i[-1].payload)]
        for source in reversed(self.i[:-1]):
            with m.If(source.valid):
                m.d.comb += [self.o.valid.eq(1), self.o.payload.eq(source.payload)]
        earlier = 0
        for source in self.i:
            m.d.comb += source.ready.eq(self.o.ready & ~earlier)
            earlier = earlier | source.valid
        return m


def mapped(m, source, shape, payload):
    """``source`` seen as a stream of ``shape``: the same handshake, the payload made by
    ``payload(source_payload, payload_view)`` (the assignments that fill the view)."""
    target = stream.Signature(shape).create()
    m.d.comb += [target.valid.eq(source.valid), source.ready.eq(target.ready),
                 *payload(source.payload, target.payload)]
    return target
