from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ArgMax"]


class ArgMax(wiring.Component):
    """The index of the first maximal value of a stream: ties go to the lowest index.

    Parameters
    ----------
    value_bits : int
        Width of the signed values (the logits' bound).
    length : int
        Most values in one run (the vocab).

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"value": signed(value_bits), "last": 1})))``
        The values in index order; ``last`` ends a run.
    o : ``Out(stream.Signature(range(length)))``
        The index of the run's first maximum.

    Throughput one value per cycle; the index is valid the cycle after the last value.
    """

    def __init__(self, value_bits, length):
        self.value_bits, self.length = value_bits, length
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"value": signed(value_bits), "last": 1}))),
            "o": Out(stream.Signature(range(length))),
        })

    def elaborate(self, platform):
        m = Module()
        index = Signal(range(self.length))
        best = Signal(signed(self.value_bits))
        best_index = Signal(range(self.length))

        m.d.comb += self.i.ready.eq(~self.o.valid)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            # Strictly greater: an equal value later in the run never displaces the first.
            better = (index == 0) | (self.i.payload.value > best)
            winner = Signal(range(self.length))
            m.d.comb += winner.eq(best_index)
            with m.If(better):
                m.d.comb += winner.eq(index)
                m.d.sync += [best.eq(self.i.payload.value), best_index.eq(index)]
            with m.If(self.i.payload.last):
                m.d.sync += [index.eq(0), self.o.payload.eq(winner), self.o.valid.eq(1)]
            with m.Else():
                m.d.sync += index.eq(index + 1)
        return m
