from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ArgMax", "first_maximum"]


def first_maximum(live, greater):
    """Which of ``n`` values is the first maximum among the live ones, from their comparisons:
    ``live[k]`` whether value k counts, ``greater[j, k]`` (j < k) whether value k > value j.
    Value k wins if it is live, strictly greater than every live one before it (an equal
    one earlier keeps the win) and not less than every live one after it; at most one wins,
    and one does whenever any is live. Only logic on the bits: the comparisons can all run
    side by side."""
    n = len(live)
    winners = []
    for k in range(n):
        wins = live[k]
        for j in range(n):
            if j < k:
                wins &= ~live[j] | greater[j, k]
            elif j > k:
                wins &= ~live[j] | ~greater[k, j]
        winners.append(wins)
    return winners


class ArgMax(wiring.Component):
    """The index of the first maximal value of a stream: ties go to the lowest index.

    Parameters
    ----------
    value_bits : int
        Width of the signed values (the logits' bound).
    length : int
        Most values in one run (the vocab).
    ways : int
        Values per input word.

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"values", "count", "last"})))``
        The values in index order, ``ways`` a word, the first ``count`` of a word in the run;
        ``last`` ends a run.
    o : ``Out(stream.Signature(range(length)))``
        The index of the run's first maximum.

    Throughput one word per cycle; the index is valid three cycles after the last word.
    """

    def __init__(self, value_bits, length, *, ways=1):
        self.value_bits, self.length, self.ways = value_bits, length, ways
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "values": data.ArrayLayout(signed(value_bits), ways),
                "count": range(ways + 1),
                "last": 1,
            }))),
            "o": Out(stream.Signature(range(length))),
        })

    def elaborate(self, platform):
        m = Module()
        ways = self.ways

        # Stage 1: every pair of the word compared as it arrives: pairs[j, k] is "value k > value j".
        word = self.i.payload
        values = word.values
        taken = self.i.valid & self.i.ready
        pairs = {(j, k): Signal(name=f"greater_{k}_{j}") for j in range(ways) for k in range(j + 1, ways)}
        compared = Signal.like(word)
        compared_in = Signal()
        m.d.sync += compared_in.eq(taken)
        with m.If(taken):
            m.d.sync += compared.eq(word)
            m.d.sync += [bit.eq(values[k] > values[j]) for (j, k), bit in pairs.items()]

        # Stage 2: the word's first maximum among its counted values: the value that is
        # greater than every counted one before it and not less than every counted one after.
        # Strictly greater, so that an equal value later in the word (or the run) never
        # displaces the first.
        word_best = Signal(signed(self.value_bits))
        word_offset = Signal(range(ways))
        word_valid = Signal()
        word_last = Signal()
        winners = first_maximum([k < compared.count for k in range(ways)], pairs)
        best, offset = compared.values[0], 0
        for k in range(1, ways):
            best, offset = Mux(winners[k], compared.values[k], best), Mux(winners[k], k, offset)
        m.d.sync += [word_valid.eq(compared_in), word_last.eq(compared_in & compared.last)]
        with m.If(compared_in):
            m.d.sync += [word_best.eq(best), word_offset.eq(offset)]

        # Stage 3: against the run's best so far.
        base = Signal(range(self.length + ways))  # the index of the word's first value
        run_best = Signal(signed(self.value_bits))
        run_index = Signal(range(self.length))
        # One run at a time: its last word goes through before the next run starts.
        m.d.comb += self.i.ready.eq(~self.o.valid & ~word_last & ~(compared_in & compared.last))
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(word_valid):
            better = (base == 0) | (word_best > run_best)
            winner = Signal(range(self.length))
            m.d.comb += winner.eq(Mux(better, base + word_offset, run_index))
            with m.If(better):
                m.d.sync += [run_best.eq(word_best), run_index.eq(winner)]
            with m.If(word_last):
                m.d.sync += [base.eq(0), self.o.payload.eq(winner), self.o.valid.eq(1)]
            with m.Else():
                m.d.sync += base.eq(base + ways)
        return m
