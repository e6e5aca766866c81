from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
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
    plan : :class:`plan.units.ArgMaxPlan`
        The values' width (the logits' bound), the most values in one run (the vocab), the
        values per input word (in the engine, all the MAC lanes' sums of the head) and the
        tournament's stages.

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"values", "count", "last"})))``
        The values in index order, ``ways`` a word, the first ``count`` of a word in the run;
        ``last`` ends a run.
    o : ``Out(stream.Signature(range(length)))``
        The index of the run's first maximum.

    A word's first maximum is found by a tournament, a tree of pairwise contests
    ``LEVELS_PER_STAGE`` levels to a pipeline stage (one: a contest is a comparison and a
    select), then held against the run's best (unless ``length <= ways``: a run is then one
    word, whose first maximum is the run's, and the tournament's last stage is the output
    register). Throughput one word per cycle; the index is valid ``latency`` cycles after the
    last word is taken.
    """

    def __init__(self, plan):
        self.plan = plan
        self.value_bits, self.length, self.ways = plan.value_bits, plan.length, plan.ways
        self.levels, self.stages, self.single, self.latency = plan.levels, plan.stages, plan.single, plan.latency
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "values": data.ArrayLayout(signed(plan.value_bits), plan.ways),
                "count": range(plan.ways + 1),
                "last": 1,
            }))),
            "o": Out(stream.Signature(range(plan.length))),
        })

    def elaborate(self, platform):
        m = Module()
        ways = self.ways
        word = self.i.payload
        taken = self.i.valid & self.i.ready

        # The tournament: each contender is (live, value, offset in its part of the word).
        # Of two, the later wins only if it is live and strictly greater than a live earlier
        # one (or the earlier is not live), so that the first maximum keeps the win on a tie.
        # The winner's offset gains one bit a level, which half it came from: every bit is a
        # select or a comparison's result, none a constant (selects between constant offsets
        # become set and reset logic, a long route to a far register).
        def contest(early, late):
            live_e, value_e, offset_e = early
            live_l, value_l, offset_l = late
            late_wins = live_l & (~live_e | (value_l > value_e))
            return (live_e | live_l, Mux(late_wins, value_l, value_e),
                    Cat(Mux(late_wins, offset_l, offset_e), late_wins))

        def bye(alone):  # the last of an odd number: the earlier half, unopposed
            live, value, offset = alone
            return live, value, Cat(offset, Const(0, 1))

        contenders = [(k < word.count, word.values[k], Const(0, 0)) for k in range(ways)]
        valid, last = taken, taken & word.last
        levels = 0  # the offsets' width
        for stage in range(self.stages):
            for _ in range(self.plan.LEVELS_PER_STAGE):
                if len(contenders) > 1:
                    contenders = [contest(*contenders[at:at + 2]) if at + 1 < len(contenders) else bye(contenders[at])
                                  for at in range(0, len(contenders), 2)]
                    levels += 1
            if self.single and stage == self.stages - 1:
                break
            registered = []
            for n, (live, value, offset) in enumerate(contenders):
                names = [f"stage{stage}_{what}{n}" for what in ("live", "value", "offset")]
                held = (Signal(name=names[0]), Signal(signed(self.value_bits), name=names[1]),
                        Signal(levels, name=names[2]))
                m.d.sync += [held[0].eq(live), held[1].eq(value), held[2].eq(offset)]
                registered.append(held)
            contenders = registered
            stage_valid, stage_last = Signal(name=f"stage{stage}_valid"), Signal(name=f"stage{stage}_last")
            m.d.sync += [stage_valid.eq(valid), stage_last.eq(last)]
            valid, last = stage_valid, stage_last
        (_, word_best, word_offset), = contenders

        # One run at a time: its last word goes through before the next run starts.
        in_flight = Signal()  # a run's last word is taken and not yet out
        with m.If(taken & word.last):
            m.d.sync += in_flight.eq(1)
        with m.If(valid & last):
            m.d.sync += in_flight.eq(0)
        m.d.comb += self.i.ready.eq(~self.o.valid & ~in_flight)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        if self.single:
            with m.If(valid & last):
                m.d.sync += [self.o.payload.eq(word_offset), self.o.valid.eq(1)]
            return m

        # Against the run's best so far.
        base = Signal(range(self.length + ways))  # the index of the word's first value
        run_best = Signal(signed(self.value_bits))
        run_index = Signal(range(self.length))
        with m.If(valid):
            better = (base == 0) | (word_best > run_best)
            winner = Signal(range(self.length))
            m.d.comb += winner.eq(Mux(better, base + word_offset, run_index))
            with m.If(better):
                m.d.sync += [run_best.eq(word_best), run_index.eq(winner)]
            with m.If(last):
                m.d.sync += [base.eq(0), self.o.payload.eq(winner), self.o.valid.eq(1)]
            with m.Else():
                m.d.sync += base.eq(base + ways)
        return m
