from amaranth.hdl import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from int8model.bounds import Bound

from .divider import FloorDivider
from .kv_cache import CacheRead
from .product import product_stages, split_product
from .requant import Requant, Rule

__all__ = ["Attention"]


def saturating_gap(rule, nlut, most):
    """The least gap from which on every gap reads the same exp table entry (``most`` at the
    highest): ``clamp(rq(gap, M_score), 0, nlut − 1)`` only grows with the gap for a positive
    multiplier (and is 0 for any other), so a gap clamped to it reads what it would."""
    if rule.multiplier <= 0:
        return 0
    return min(most, -(-((nlut - 1) << rule.shift) // rule.multiplier))


class Attention(wiring.Component):
    """LUT-softmax attention of one query over cache rows 0..pos, every head at once (docs/semantics.md, step 3).

    Three phases, all heads in parallel:

    1. *Scores*: one cache row per cycle; ``d_model`` multipliers form ``q · K[j]`` per head,
       kept in a small score memory, with each head's running maximum.
    2. *Weights*: one row per cycle again; each head's LUT index
       ``clamp(rq(max − s_j, M_score), 0, NLUT − 1)`` reads the exp table, the weights add up to
       ``den``, and the same multipliers form ``w_j · V[j]`` into the ``num`` accumulators.
    3. *Context*: each column's ``fdiv(num, den)`` through a pipelined floor divider, then the
       ``r_ctx`` requant and int8 clamp; ``ci`` leaves ``ways`` columns a cycle in column order,
       through as many dividers and requants.

    Widths come from the model's bounds (:func:`int8model.bounds.analyse`).

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"q": ArrayLayout(signed(8), d_model), "pos"})))``
        The query and its position; the cache rows 0..pos−1 must already be written.
    cache : ``Out(CacheRead(d_model, seq_len))``
    keys_ready : ``In(1)``
        The K row at ``pos`` is written: the score phase waits for it before its last row, so
        that it can score the rows already cached while K is still being computed.
    values_ready : ``In(1)``
        The V row at ``pos`` is written: the weight phase waits for it, so that the score
        phase can run while V is still being computed.
    o : ``Out(stream.Signature(StructLayout({"values", "count", "last"})))``
        ``ci`` in column order (at most int8 wide), ``ways`` columns a word, the first ``count``
        of them the vector's; ``last`` marks the last word.

    Latency: ``2·(pos + 1) + 19`` cycles from taking the query to the first ``ci`` (with the
    K and V rows ready), then one word per cycle.
    Multipliers: ``d_model`` (shared by the two row phases) plus ``n_heads`` for ``M_score``.
    """

    SCORE_LATENCY = 5   # issue → row address → K row → operands → products → head sums, written
    # issue → gap → operand → × M_score (two cycles when cut) → index → LUT/V read → operands
    # → products → num
    WEIGHT_LATENCY = 7

    def __init__(self, model, bounds, *, ways=1):
        self.d_model, self.n_heads, self.seq_len = model.d_model, model.n_heads, model.seq_len
        self.ways = ways
        self.head_dim = model.head_dim
        self.exp_lut = [int(v) for v in model.exp_lut]
        self.score_rule = Rule.rq(model.requant["M_score"])
        self.ctx_rule = Rule.to8(model.requant["r_ctx"])
        self.bounds = {k: bounds[k] for k in ("q", "k", "v", "scores", "score_gap",
                                              "score_gap*M_score", "weights", "den", "num", "ctx")}
        self.score_bits = bounds["scores"].bits
        self.gap_bits = bounds["score_gap"].bits
        # The gaps are clamped where the LUT index stops changing: the M_score product is
        # then narrower (one multiplier, one cycle, for the seed-size model).
        self.gap_limit = saturating_gap(self.score_rule, len(self.exp_lut), bounds["score_gap"].hi)
        self.gap_stages = product_stages(max(1, self.gap_limit.bit_length()), signed=False)
        self.weight_bits = bounds["weights"].bits
        self.operand_bits = max(8, self.weight_bits)
        self.product_bits = Bound(-(1 << (self.operand_bits - 1)) * 128,
                                  (1 << (self.operand_bits - 1)) * 128).bits
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "q": data.ArrayLayout(signed(8), self.d_model), "pos": range(self.seq_len)}))),
            "cache": Out(CacheRead(self.d_model, self.seq_len)),
            "keys_ready": In(1),
            "values_ready": In(1),
            "o": Out(stream.Signature(data.StructLayout({
                "values": data.ArrayLayout(signed(self.ctx_rule.result_bound(bounds["ctx"]).bits), ways),
                "count": range(ways + 1),
                "last": 1,
            }))),
        })

    @property
    def multipliers(self):
        return self.d_model + self.n_heads + self.ways

    def elaborate(self, platform):
        m = Module()
        d, heads, hd = self.d_model, self.n_heads, self.head_dim
        nlut = len(self.exp_lut)
        b = self.bounds

        q = Signal(data.ArrayLayout(signed(8), d))
        pos = Signal(range(self.seq_len))
        row = Signal(range(self.seq_len))          # the row being issued
        issuing = Signal()

        # -- The shared multipliers: q·K in the score phase, w·V in the weight phase.
        scoring = Signal()
        operand_a = [Signal(signed(self.operand_bits), name=f"a{e}") for e in range(d)]
        operand_b = [Signal(signed(8), name=f"b{e}") for e in range(d)]
        products = [Signal(signed(self.product_bits), name=f"p{e}") for e in range(d)]
        # Operands are registered: the phase select fans out to every multiplier.
        registered_a = [Signal.like(a, name=f"ra{e}") for e, a in enumerate(operand_a)]
        registered_b = [Signal.like(b, name=f"rb{e}") for e, b in enumerate(operand_b)]
        for a, bb, ra, rb, p in zip(operand_a, operand_b, registered_a, registered_b, products):
            m.d.sync += [ra.eq(a), rb.eq(bb), p.eq(ra * rb)]

        # -- Phase 1: scores.
        score_layout = data.ArrayLayout(signed(self.score_bits), heads)
        m.submodules.scores = scores = memory.Memory(shape=score_layout, depth=self.seq_len, init=[])
        score_write = scores.write_port()
        # One cycle of latency; transparent, as the weight phase may read row 0 in the cycle its
        # score is written (see SCORE_DRAIN).
        score_read = scores.read_port(transparent_for=(score_write,))
        peak = Signal(score_layout)

        s_valid = Signal(self.SCORE_LATENCY)
        s_row = [Signal(range(self.seq_len), name=f"s_row{i}") for i in range(self.SCORE_LATENCY)]
        # The last scores are still on their way while the weight phase starts (see SCORE_DRAIN).
        m.d.sync += [s_valid.eq((s_valid << 1) | (issuing & scoring))]
        m.d.sync += s_row[0].eq(row)
        for early, late in zip(s_row, s_row[1:]):
            m.d.sync += late.eq(early)
        head_sums = Signal(score_layout)
        for g in range(heads):
            m.d.sync += head_sums[g].eq(sum(products[g * hd:(g + 1) * hd]))
        m.d.comb += [
            score_write.addr.eq(s_row[4]),
            score_write.data.eq(head_sums),
            score_write.en.eq(s_valid[4]),
        ]
        with m.If(s_valid[4]):
            for g in range(heads):
                with m.If((s_row[4] == 0) | (head_sums[g] > peak[g])):
                    m.d.sync += peak[g].eq(head_sums[g])

        # -- Phase 2: weights, den, num.
        weight_latency = self.WEIGHT_LATENCY + self.gap_stages
        w_valid = Signal(weight_latency)
        w_row = [Signal(range(self.seq_len), name=f"w_row{i}") for i in range(weight_latency)]
        m.d.sync += [w_valid.eq(Mux(scoring, 0, (w_valid << 1) | issuing))]
        m.d.sync += w_row[0].eq(row)
        for early, late in zip(w_row, w_row[1:]):
            m.d.sync += late.eq(early)
        m.d.comb += score_read.addr.eq(row)

        gaps = Signal(data.ArrayLayout(unsigned(max(1, self.gap_bits)), heads))
        scaled = []
        for g in range(heads):
            m.d.sync += gaps[g].eq(peak[g] - score_read.data[g])
            # The multiplier's own operand register, placed beside it: with most of the
            # part's multipliers in use, the one this product gets may be far from `gaps`.
            operand = Signal(range(self.gap_limit + 1), name=f"gap_operand{g}")
            m.d.sync += operand.eq(Mux(gaps[g] > self.gap_limit, self.gap_limit, gaps[g]))
            scaled.append(split_product(m, operand, Const(self.score_rule.multiplier), 1,
                                        b["score_gap*M_score"].bits, f"scaled{g}"))
        late = self.gap_stages  # the operand register, and a cut product's second cycle

        m.submodules.exp_lut = lut = memory.Memory(
            shape=unsigned(max(1, self.weight_bits)), depth=nlut, init=self.exp_lut)
        weights = []
        for g in range(heads):
            index = scaled[g] >> self.score_rule.shift
            clamped = Signal(range(nlut), name=f"lut_index{g}")
            m.d.sync += clamped.eq(Mux(index < 0, 0, Mux(index > nlut - 1, nlut - 1, index)))
            port = lut.read_port()  # one cycle of latency: lands with the V row
            m.d.comb += port.addr.eq(clamped)
            weights.append(port.data)

        # The cache's address is registered (it reaches every block RAM of the cache): a K row
        # arrives two cycles after its issue; the V row in step with the LUT, whose addresses
        # both leave in the fifth cycle.
        m.d.sync += self.cache.row.eq(Mux(scoring, row, w_row[2 + late]))
        for e in range(d):
            m.d.comb += [
                operand_a[e].eq(Mux(scoring, q[e], weights[e // hd])),
                operand_b[e].eq(Mux(scoring, self.cache.k[e], self.cache.v[e])),
            ]

        den = Signal(data.ArrayLayout(signed(b["den"].bits), heads))
        num = Signal(data.ArrayLayout(signed(b["num"].bits), d))
        with m.If(~scoring & w_valid[4 + late]):
            for g in range(heads):
                m.d.sync += den[g].eq(Mux(w_row[4 + late] == 0, 0, den[g]) + weights[g])
        # The numerators' enable and first-row select reach every numerator: registered a
        # stage early, and the select applied after the adder, beside it.
        num_add = Signal()
        num_first = Signal()
        m.d.sync += [num_add.eq(~scoring & w_valid[5 + late]), num_first.eq(w_row[5 + late] == 0)]
        with m.If(num_add):
            for e in range(d):
                m.d.sync += num[e].eq(Mux(num_first, products[e], num[e] + products[e]))

        # -- Phase 3: the context, through `ways` dividers and r_ctx requants side by side;
        # they move in step, the first carrying the word's count and end.
        ways = self.ways
        column = Signal(range(d + ways))
        head_of = Array(Const(min(c, d - 1) // hd, range(heads)) for c in range(d + 2 * ways))
        # The head of each column of the word, kept in registers a word ahead of its use.
        heads_of_word = [Signal(range(heads), name=f"head{k}") for k in range(ways)]
        word = data.StructLayout({"count": range(ways + 1), "last": 1})
        dividers, requants = [], []
        for k in range(ways):
            tag = word if k == 0 else unsigned(0)
            divider = FloorDivider(b["num"], b["den"], b["ctx"], tag_shape=tag)
            requant = Requant(b["ctx"], [self.ctx_rule], tag_shape=tag, registered_input=True)
            m.submodules[f"divider{k}"], m.submodules[f"requant{k}"] = divider, requant
            wiring.connect(m, divider.o, requant.i)
            m.d.comb += [
                divider.i.payload.num.eq(num[k] if k < d else 0),
                divider.i.payload.den.eq(den[heads_of_word[k]]),
                self.o.payload.values[k].eq(requant.o.payload.value),
                requant.o.ready.eq(self.o.ready),
            ]
            dividers.append(divider)
            requants.append(requant)
        remaining = d - column
        m.d.comb += [
            dividers[0].i.payload.tag.count.eq(Mux(remaining < ways, remaining, ways)),
            dividers[0].i.payload.tag.last.eq(remaining <= ways),
            self.o.valid.eq(requants[0].o.valid),
            self.o.payload.count.eq(requants[0].o.payload.tag.count),
            self.o.payload.last.eq(requants[0].o.payload.tag.last),
        ]

        # The query is copied on every idle cycle (so also on the one that takes it): its
        # enable is then one register, not the state decode and the input's valid.
        idle = Signal(init=1)
        with m.If(idle):
            m.d.sync += q.eq(self.i.payload.q)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [pos.eq(self.i.payload.pos), row.eq(0), scoring.eq(1), idle.eq(0)]
                    m.next = "SCORE"
            # A pass issues rows 0..pos, one a cycle, then waits for its pipeline to drain.
            for phase in ("SCORE", "WEIGHT"):
                with m.State(phase):
                    # The score of row pos waits for its K row.
                    m.d.comb += issuing.eq((row != pos) | self.keys_ready if phase == "SCORE" else 1)
                    with m.If(issuing):
                        m.d.sync += row.eq(row + 1)
                        with m.If(row == pos):
                            m.next = f"{phase}_DRAIN"
            with m.State("SCORE_DRAIN"):
                # The weight phase reads a row's score as it issues it, and works out its gap
                # from the maximum a cycle later: it may start as the last score reaches the
                # next-to-last stage, so that the maximum is complete in time for row 0.
                with m.If((s_valid[:self.SCORE_LATENCY - 2] == 0) & self.values_ready):
                    m.d.sync += [row.eq(0), scoring.eq(0)]
                    m.next = "WEIGHT"
            with m.State("WEIGHT_DRAIN"):
                # The numerators are complete a cycle after the last row leaves the pipeline's
                # last stage but one: the dividers take them from then.
                with m.If(w_valid[:weight_latency - 1] == 0):
                    m.d.sync += column.eq(0)
                    m.d.sync += [head.eq(head_of[k]) for k, head in enumerate(heads_of_word)]
                    m.next = "CONTEXT"
            with m.State("CONTEXT"):
                m.d.comb += [divider.i.valid.eq(1) for divider in dividers]
                with m.If(dividers[0].i.ready):
                    # Shift the numerators down so that the dividers always read num[0..ways).
                    for e in range(d - ways):
                        m.d.sync += num[e].eq(num[e + ways])
                    m.d.sync += column.eq(column + ways)
                    m.d.sync += [head.eq(head_of[column + ways + k]) for k, head in enumerate(heads_of_word)]
                    with m.If(column + ways >= d):
                        m.d.sync += scoring.eq(1)
                        m.d.sync += idle.eq(1)
                        m.next = "IDLE"
        return m
