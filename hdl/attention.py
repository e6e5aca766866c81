from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .argmax import first_maximum
from .divider import FloorDivider
from .fanout import replicas
from .fifo import StreamFIFO
from .kv_cache import CacheRead
from .loader import connect_load, load_port
from .product import dsp_product, lut_product, operand_terms, split_product, tree_sum
from .requant import shifted_clamp
from .scores import score_memory

__all__ = ["Attention"]


class Attention(wiring.Component):
    """LUT-softmax attention of one query over cache rows 0..pos, every head at once (docs/semantics.md, step 3).

    Three phases, all heads in parallel:

    1. *Scores*: ``rows`` cache rows per cycle (a group, one row from each bank of the cache);
       ``d_model`` multipliers per row form ``q · K[j]`` per head, kept in a small score
       memory per bank, with each head's running maximum.
    2. *Weights*: a group per cycle again; each head's LUT index
       ``clamp(rq(max − s_j, M_score), 0, NLUT − 1)`` reads the exp table, the weights add up to
       ``den``, and the same multipliers form ``w_j · V[j]`` into the ``num`` accumulators.
    3. *Context*: each column's ``fdiv(num, den)`` through a pipelined floor divider, whose last
       stage also applies ``r_ctx`` and the int8 clamp (a table of the results of the quotients
       it may find); ``ci`` leaves ``ways`` columns a cycle in column order, through as many
       dividers.

    Its plan (:class:`plan.attention.AttentionPlan`) holds every width, from the model's bounds,
    and the exp table's depth; ``exp_entries`` are the table's entries as read
    (:func:`plan.attention.exp_entries`; ``None``: zero).

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"q": ArrayLayout(signed(8), d_model), "pos"})))``
        The query and its position; the cache rows 0..pos−1 must already be written.
    cache : ``Out(CacheRead(plan.cache))``
    keys_ready : ``In(1)``
        The K row at ``pos`` was written, in an earlier cycle (the group of a row is read as it
        issues): the score phase waits for it before the group of row ``pos``, so that it can
        score the rows already cached while K is still being computed.
    values_ready : ``In(1)``
        The V row at ``pos`` is written: the weight phase waits for it likewise, so that it
        can weigh the rows already cached while V is still being computed.
    o : ``Out(stream.Signature(StructLayout({"values", "count", "last"})))``
        ``ci`` in column order (at most int8 wide), ``ways`` columns a word, the first ``count``
        of them the vector's; ``last`` marks the last word.

    Latency: ``2·ceil((pos + 1) / rows) + 16 + plan.sum_stages`` cycles (for pos < rows, one
    more, and another where the scores' read is held, ``plan.score_read_stages``)
    from taking the query to the first ``ci`` (with the K and V rows ready), then a word a cycle.
    Multipliers: ``d_model`` per row of a group, shared by the two row phases (the first row's
    DSP blocks, the others' LUT logic), plus ``n_heads`` per row for ``M_score``.
    """

    # issue (the row address already holds it) → K row → its register → operands → products
    # → pair sums (→ sums of four, plan.sum_stages) → head sums, written
    SCORE_LATENCY = 4
    # issue → score read (→ its register, plan.score_read_stages) → gap → gap operand → × M_score
    # (two cycles when cut) → index into the LUT's read, V read (a cycle earlier, through its
    # register) → operands → products → column sums → num
    WEIGHT_LATENCY = 7
    SELECT_COLUMNS = 4   # columns of multipliers per copy of the phase register

    def __init__(self, plan, exp_entries=None, *, rules=None):
        self.plan = plan
        self.d_model, self.n_heads, self.seq_len = plan.d_model, plan.n_heads, plan.seq_len
        self.ways, self.rows, self.groups, self.head_dim = plan.ways, plan.rows, plan.groups, plan.head_dim
        self.score_rule, self.ctx_requant = plan.score_rule, plan.ctx_requant
        self.score_bits, self.gap_bits, self.weight_bits = plan.score_bits, plan.gap_bits, plan.weight_bits
        self.gap_operand_bits, self.gap_stages, self.operand_bits = plan.gap_operand_bits, plan.gap_stages, plan.operand_bits
        self.exp_spread = plan.exp_spread
        # The table as read: at every index a clamped gap gives, its last entry repeated past its
        # end, so that no comparison lies between the M_score product and the table; where that
        # takes too many entries, as it stands, behind a clamp (plan.attention.exp_entries).
        self.exp_entries = list(exp_entries) if exp_entries is not None else [0] * plan.exp_depth
        if len(self.exp_entries) != plan.exp_depth:
            raise ValueError(f"{len(self.exp_entries)} exp table entries, the plan reads {plan.exp_depth}")
        self.layers = plan.layers
        if plan.loaded and rules is None:
            raise ValueError("a loadable build's attention reads M_score from the rule registers")
        self.rules = rules
        layer = {} if self.layers == 1 else {"layer": range(self.layers)}
        loads = {"load_exp": In(load_port(plan.exp_depth, max(1, self.weight_bits))),
                 "load_ctx": In(load_port(plan.ctx_table_depth, 8))}
        super().__init__({
            **(loads if plan.loaded else {}),
            "i": In(stream.Signature(data.StructLayout({
                "q": data.ArrayLayout(signed(8), self.d_model), "pos": range(self.seq_len), **layer}))),
            "cache": Out(CacheRead(plan.cache)),
            "keys_ready": In(1),
            "values_ready": In(1),
            "o": Out(stream.Signature(self.output_layout(plan))),
        })

    @staticmethod
    def output_layout(plan):
        return data.StructLayout({
            "values": data.ArrayLayout(signed(plan.ctx_bits), plan.ways),
            "count": range(plan.ways + 1),
            "last": 1,
            **({} if plan.layers == 1 else {"layer": range(plan.layers)}),
        })

    def elaborate(self, platform):
        m = Module()
        d, heads, hd, rows = self.d_model, self.n_heads, self.head_dim, self.rows
        bank_bits = rows.bit_length() - 1
        nlut = self.plan.nlut
        plan = self.plan

        q = Signal(data.ArrayLayout(signed(8), d))
        # A deep model's query brings its layer: its cache rows, its M_score, its r_ctx.
        layer = Signal(range(self.layers))
        score_multiplier = Signal(signed(plan.score_multiplier_bits))
        score_shift = None
        if plan.loaded:  # the query's layer's, from the rule registers
            loaded_multiplier, score_shift = self.rules.score(layer if self.layers > 1 else 0)
            m.d.comb += score_multiplier.eq(loaded_multiplier)
        elif self.layers > 1:
            m.d.comb += score_multiplier.eq(Array(Const(r.multiplier, signed(plan.score_multiplier_bits))
                                                  for r in plan.score_rules)[layer])
        pos = Signal(range(self.seq_len))
        group = Signal(range(self.groups))  # the group of rows being issued (0 while idle)
        next_group = Signal.like(group)  # what `group` holds next cycle
        m.d.comb += next_group.eq(group)
        m.d.sync += group.eq(next_group)
        last_group = pos >> bank_bits
        issuing = Signal()
        idle = Signal(init=1)
        # The rows of the group that are in 0..pos (only the last group may hold fewer; while
        # idle, group 0 is issued only where it is not the last).
        in_range = Signal(rows)
        for r in range(rows):
            m.d.comb += in_range[r].eq(idle | (group != last_group) | (r <= pos[:bank_bits] if bank_bits else 1))

        # -- The shared multipliers, one set per bank: q·K in the score phase, w·V in the
        # weight phase. The first bank's are DSP blocks, the others' LUT logic.
        scoring = Signal(init=1)
        # The phase also selects every multiplier's operands: a copy per SELECT_COLUMNS
        # columns, each near its multipliers (one register reaching them all is a route across
        # the part).
        operand_scoring = replicas(1, -(-d // self.SELECT_COLUMNS), "operand_scoring", init=1)

        def set_scoring(value):
            m.d.sync += [copy.eq(value) for copy in [scoring, *operand_scoring]]

        def set_context(value):  # the context phase's registers: the dividers' valid, the shift's copies
            m.d.sync += [copy.eq(value) for copy in [dividing, *shifting]]
        operand_a = [[Signal(signed(self.operand_bits), name=f"a{r}_{e}") for e in range(d)] for r in range(rows)]
        operand_b = [[Signal(signed(8), name=f"b{r}_{e}") for e in range(d)] for r in range(rows)]
        products = [[] for _ in range(rows)]  # per bank and column: the product's terms
        for r in range(rows):
            for e in range(d):
                # Operands are registered (the phase select fans out to every multiplier): in a
                # DSP block, its own input registers (see operand_product).
                if r == 0:
                    registers, terms = dsp_product(m, platform, operand_a[r][e], operand_b[r][e], name=f"p{r}_{e}")
                else:
                    ra = Signal.like(operand_a[r][e], name=f"ra{r}_{e}")
                    rb = Signal.like(operand_b[r][e], name=f"rb{r}_{e}")
                    m.d.sync += [ra.eq(operand_a[r][e]), rb.eq(operand_b[r][e])]
                    registers, terms = lut_product(ra, rb, name=f"p{r}_{e}")
                m.d.sync += registers
                products[r].append(terms)

        # -- Phase 1: scores, a group of rows a cycle: each bank's in its own score memory.
        score_layout = data.ArrayLayout(signed(self.score_bits), heads)
        score_writes = [[] for _ in range(rows)]
        score_data = [[] for _ in range(rows)]
        for r in range(rows):
            for g in range(heads):
                write, read = score_memory(m, plan, group, r, g)
                score_writes[r].append(write)
                score_data[r].append(read)
        peak = Signal(score_layout)

        score_latency = self.SCORE_LATENCY + plan.sum_stages
        s_valid = Signal(score_latency)
        s_group = [Signal(range(self.groups), name=f"s_group{i}") for i in range(score_latency)]
        s_rows = [Signal(rows, name=f"s_rows{i}") for i in range(score_latency)]
        # The last scores are still on their way while the weight phase starts (see SCORE_DRAIN).
        m.d.sync += [s_valid.eq((s_valid << 1) | (issuing & scoring))]
        m.d.sync += [s_group[0].eq(group), s_rows[0].eq(in_range)]
        for early, later in zip(s_group + s_rows, s_group[1:] + [None] + s_rows[1:]):
            if later is not None:
                m.d.sync += later.eq(early)
        # A head's sum in stages: its terms added two by two into registers (a LUT product's
        # two halves, or two columns' DSP products), where the plan says so those four by four,
        # then those: a LUT bank's sixteen terms a head at once would be five levels of logic
        # and a carry chain. Every sum is kept to the score's width: any carry out of it
        # cancels in the head's sum, which fits.
        head_sums = [Signal(score_layout, name=f"head_sums{r}") for r in range(rows)]
        for r in range(rows):
            for g in range(heads):
                sums = [t for e in range(g * hd, (g + 1) * hd) for t in products[r][e]]
                for kind, width in [("pair", 2), ("quad", 4)][:plan.sum_stages - 1]:
                    terms, sums = sums, [Signal(signed(self.score_bits), name=f"{kind}_sum{r}_{g}_{i // width}")
                                         for i in range(0, len(sums), width)]
                    m.d.sync += [total.eq(tree_sum(terms[width * i:width * (i + 1)])) for i, total in enumerate(sums)]
                m.d.sync += head_sums[r][g].eq(tree_sum(sums))
            m.d.comb += [
                *(write.addr.eq(s_group[-1]) for write in score_writes[r]),
                *(write.data.eq(head_sums[r][g]) for g, write in enumerate(score_writes[r])),
                *(write.en.eq(s_valid[-1]) for write in score_writes[r]),
            ]
        # The maximum in two stages: the group's first maximum into a register, then the
        # running one, whose loop is then one comparison and a select (the sums come from
        # multipliers all over the part: their routes end in the group's register).
        group_best = Signal(score_layout)
        group_valid = Signal()
        group_first = Signal()
        m.d.sync += [group_valid.eq(s_valid[-1]), group_first.eq(s_group[-1] == 0)]
        with m.If(s_valid[-1]):
            for g in range(heads):
                # Every comparison side by side (one carry chain deep), then only logic on their bits.
                sums = [head_sums[r][g] for r in range(rows)]
                greater = {(j, k): sums[k] > sums[j] for j in range(rows) for k in range(j + 1, rows)}
                taken = first_maximum([s_rows[-1][r] for r in range(rows)], greater)
                best = sums[0]
                for r in range(1, rows):
                    best = Mux(taken[r], sums[r], best)
                m.d.sync += group_best[g].eq(best)
        with m.If(group_valid):
            for g in range(heads):
                with m.If(group_first | (group_best[g] > peak[g])):
                    m.d.sync += peak[g].eq(group_best[g])

        # -- Phase 2: weights, den, num, a group of rows a cycle again.
        weight_latency = self.WEIGHT_LATENCY + plan.score_read_stages + self.gap_stages
        w_valid = Signal(weight_latency)
        w_group = [Signal(range(self.groups), name=f"w_group{i}") for i in range(weight_latency)]
        w_rows = [Signal(rows, name=f"w_rows{i}") for i in range(weight_latency)]
        m.d.sync += [w_valid.eq(Mux(scoring, 0, (w_valid << 1) | issuing))]
        m.d.sync += [w_group[0].eq(group), w_rows[0].eq(in_range)]
        for early, later in zip(w_group + w_rows, w_group[1:] + [None] + w_rows[1:]):
            if later is not None:
                m.d.sync += later.eq(early)
        # The stage in which the exp table's entries (and the V rows) arrive: after the score
        # read (and its register), the gap, the gap operand, the product (two cycles when cut)
        # and, where registered, the shifted index (plan.index_stages), whose index the LUT's
        # read port registers.
        lut_stage = 3 + plan.score_read_stages + self.gap_stages

        # The LUT index is clamp(rq(gap, M_score), 0, NLUT − 1). For a positive M_score it is
        # never negative, and the clamped gap bounds it (see exp_entries).
        rule = self.score_rule
        k = self.gap_operand_bits
        entries = self.exp_entries
        weights = [[] for _ in range(rows)]
        for r in range(rows):
            # A copy of the exp table per bank, read by its heads: Yosys maps a memory's read
            # ports together, and for sixteen of them (four banks of four heads) it runs out of
            # memory.
            m.submodules[f"exp_lut{r}"] = lut = memory.Memory(
                shape=unsigned(max(1, self.weight_bits)), depth=len(entries), init=entries,
                attrs={"rom_style": plan.exp_style, "ram_style": plan.exp_style})
            if plan.loaded:  # every copy takes the load's entries
                connect_load(m, lut, self.load_exp)
            for g in range(heads):
                # The gap from the maximum, into a register beside the score memory (its read
                # and the subtraction, then the clamp and the far operand register, were one
                # path), then clamped into the multiplier's operand register.
                gap = Signal(unsigned(max(1, self.gap_bits)), name=f"gap{r}_{g}")
                m.d.sync += gap.eq(peak[g] - score_data[r][g])
                clamped_gap = Signal(unsigned(k), name=f"clamped_gap{r}_{g}")
                m.d.comb += clamped_gap.eq(Mux(gap[k:].any(), (1 << k) - 1, gap[:k]))
                # A layer's M_score: a constant, or, for a deep model, the query's layer's.
                multiplier = self.score_rule.multiplier if self.layers == 1 and not plan.loaded else score_multiplier
                # A loaded M_score's product is registered before its shift (a shifter, not
                # wires), and the shifted index after it, before the clamp and the table's read;
                # a deep model's index, its layer's shift selected, is registered too.
                if plan.product_stages == 1:
                    # The clamped gap goes into the multiplier's own operand register: the
                    # route from the score memory then ends in the DSP block, and only the
                    # product's route follows it.
                    scaled, = operand_terms(m, platform, clamped_gap, multiplier, 1, plan.scaled_bound.bits,
                                            f"scaled{r}_{g}")
                else:
                    operand = Signal(unsigned(k), name=f"gap_operand{r}_{g}")
                    m.d.sync += operand.eq(clamped_gap)
                    scaled = split_product(m, operand, multiplier, 1, plan.scaled_bound.bits, f"scaled{r}_{g}")
                if plan.loaded:  # a power of two of entries: the clamp is logic on the bits
                    held = Signal.like(scaled, name=f"scaled_held{r}_{g}")
                    index = Signal.like(scaled, name=f"scaled_shifted{r}_{g}")
                    m.d.sync += [held.eq(scaled), index.eq(held >> score_shift)]
                    top = (len(entries) - 1).bit_length()
                    clamped = Mux(index[-1], 0, Mux(index[top:].any(), len(entries) - 1, index[:top]))
                elif self.layers == 1:
                    index = scaled >> rule.shift
                    clamped = index if self.exp_spread else Mux(index < 0, 0, Mux(index > nlut - 1, nlut - 1, index))
                elif self.exp_spread:
                    clamped = Signal.like(scaled, name=f"scaled_shifted{r}_{g}")
                    m.d.sync += clamped.eq(Array(scaled >> r.shift for r in plan.score_rules)[layer])
                else:  # the clamp judged beside the shift's select (after the register, it was the critical path)
                    clamped = shifted_clamp(m, scaled, [r.shift for r in plan.score_rules], layer, nlut, f"index{r}_{g}")
                lut_index = Signal(range(len(entries)), name=f"lut_index{r}_{g}")
                m.d.comb += lut_index.eq(clamped)
                port = lut.read_port()  # one cycle of latency: lands with the V row
                m.d.comb += port.addr.eq(lut_index)
                # A row past pos weighs nothing: it adds to neither den nor num.
                weights[r].append(Mux(w_rows[lut_stage][r], port.data, 0))

        # The cache's address is registered (it reaches every block RAM of the cache), and the
        # cache registers its rows (KVCache.LATENCY, two cycles). Scoring, the register is
        # loaded with the group to issue next, so that it holds a group as it issues: K rows
        # reach the multipliers' operand registers two cycles after their issue. V rows come
        # in step with the LUT's entries.
        m.d.sync += self.cache.group.eq(Mux(scoring, next_group, w_group[lut_stage - 3]))
        if self.layers > 1:
            m.d.comb += self.cache.layer.eq(layer)
        for r in range(rows):
            for e in range(d):
                select = operand_scoring[e // self.SELECT_COLUMNS]
                m.d.comb += [
                    operand_a[r][e].eq(Mux(select, q[e], weights[r][e // hd])),
                    operand_b[r][e].eq(Mux(select, self.cache.k[r][e], self.cache.v[r][e])),
                ]

        den = Signal(data.ArrayLayout(signed(plan.den_bound.bits), heads))
        num = Signal(data.ArrayLayout(signed(plan.num_bound.bits), d))
        # Where attention spreads, the dens' enable and first-group select come from registers
        # set a stage early (the same values: w_valid clears while scoring), not from the group
        # pipeline across the part (the deep demo's critical path, docs/timing.md).
        den_add, den_first = w_valid[lut_stage], w_group[lut_stage] == 0
        if plan.spread:
            den_add, den_first = Signal(name="den_add"), Signal(name="den_first")
            m.d.sync += [den_add.eq(~scoring & w_valid[lut_stage - 1]), den_first.eq(w_group[lut_stage - 1] == 0)]
        with m.If(~scoring & den_add):
            for g in range(heads):
                m.d.sync += den[g].eq(tree_sum([Mux(den_first, 0, den[g])]
                                               + [weights[r][g] for r in range(rows)]))
        # A column's products (all its banks', and a LUT product's two halves) are summed into
        # a register of their own, beside the multipliers, before they are added to the
        # numerator, so that the route from a LUT product ends in a register, not in a
        # numerator's adder tree. Kept to num's width: any carry out cancels in num.
        column_sums = [Signal(signed(plan.num_bound.bits), name=f"column_sum{e}") for e in range(d)]
        m.d.sync += [column_sums[e].eq(tree_sum(t for r in range(rows) for t in products[r][e]))
                     for e in range(d)]
        # The numerators' enable and first-group select reach every numerator: registered a
        # stage early, and the select applied beside the adder.
        num_add = Signal()
        num_first = Signal()
        m.d.sync += [num_add.eq(~scoring & w_valid[lut_stage + 2]), num_first.eq(w_group[lut_stage + 2] == 0)]
        with m.If(num_add):
            for e in range(d):
                m.d.sync += num[e].eq(Mux(num_first, 0, num[e]) + column_sums[e])

        # -- Phase 3: the context, through `ways` dividers (with r_ctx) side by side, the
        # first carrying the word's count and end. They never stall: a context starts only
        # when the queue behind them has room for all of it. So the numerators shift down
        # ``ways`` columns every cycle for d/ways cycles, on copies of one register (one per
        # SELECT_COLUMNS columns, as the phase select), rather than on the dividers' readiness
        # (which would be a route back across the part, where attention's multipliers are).
        ways = self.ways
        words = -(-d // ways)
        shifting = replicas(1, -(-d // self.SELECT_COLUMNS), "context_shift")
        # Each column's den, its head's, copied into a register of its own until the context
        # starts, shifts down with the numerators: the dividers take it from a register, with
        # no select between them (a select of each word's heads' dens, by column or by word,
        # would sit on the route to the dividers).
        column_dens = [Signal(signed(plan.den_bound.bits), name=f"column_den{e}") for e in range(d)]
        for e in range(d):
            with m.If(shifting[e // self.SELECT_COLUMNS]):
                if e < d - ways:
                    m.d.sync += [num[e].eq(num[e + ways]), column_dens[e].eq(column_dens[e + ways])]
            with m.Else():
                # Copied on every cycle until the context starts, so also from the final den:
                # the enable is the shift's register, not the state's decode.
                m.d.sync += column_dens[e].eq(den[e // hd])
        column = Signal(range(d + ways))
        word = data.StructLayout({"count": range(ways + 1), "last": 1,
                                  **({} if self.layers == 1 else {"layer": range(self.layers)})})
        m.submodules.context = queue = StreamFIFO(self.o.payload.shape(), words, fall_through=True)
        wiring.connect(m, queue.o, wiring.flipped(self.o))
        dividing = Signal()
        if plan.loaded:
            # r_ctx by a table of its results, each layer's 256 (the load's): the dividers'
            # words a cycle later, through each column's copy.
            delayed = Signal(word)
            delayed_valid = Signal()
            into_queue = Signal(self.o.payload.shape())
            m.d.comb += [queue.i.valid.eq(delayed_valid), queue.i.payload.eq(into_queue)]
            ctx_reads = []
            for k in range(ways):
                m.submodules[f"ctx_table{k}"] = table = memory.Memory(
                    shape=8, depth=plan.ctx_table_depth, init=[], attrs={"ram_style": "block"})
                connect_load(m, table, self.load_ctx)
                ctx_reads.append(table.read_port())
        for k in range(ways):
            # r_ctx on the quotient, in the divider's last stage (a table of its results).
            divider = FloorDivider(plan.divider, tag_shape=word if k == 0 else unsigned(0))
            m.submodules[f"divider{k}"] = divider
            out = divider.o
            m.d.comb += [
                divider.i.valid.eq(dividing),
                *([divider.i.payload.layer.eq(layer)] if divider.layers > 1 else []),
                divider.i.payload.num.eq(num[k] if k < d else 0),
                divider.i.payload.den.eq(column_dens[min(k, d - 1)]),
                out.ready.eq(1),
            ]
            if plan.loaded:
                read = ctx_reads[k]
                if k == 0:
                    word_out = out  # the first divider's tag: the word's layer (the query's may be the next's)
                m.d.comb += [read.addr.eq(Cat(out.payload.value[:8], word_out.payload.tag.layer) if self.layers > 1
                                          else out.payload.value[:8]),
                             into_queue.values[k].eq(read.data.as_signed())]
                if k == 0:
                    m.d.sync += [delayed_valid.eq(out.valid), delayed.eq(out.payload.tag)]
                    m.d.comb += [divider.i.payload.tag.count.eq(Mux(d - column < ways, d - column, ways)),
                                 divider.i.payload.tag.last.eq(d - column <= ways),
                                 into_queue.count.eq(delayed.count), into_queue.last.eq(delayed.last)]
                    if self.layers > 1:
                        m.d.comb += [divider.i.payload.tag.layer.eq(layer), into_queue.layer.eq(delayed.layer)]
                continue
            m.d.comb += queue.i.payload.values[k].eq(out.payload.value)
            if k == 0:
                remaining = d - column
                m.d.comb += [
                    divider.i.payload.tag.count.eq(Mux(remaining < ways, remaining, ways)),
                    divider.i.payload.tag.last.eq(remaining <= ways),
                    queue.i.valid.eq(out.valid),
                    queue.i.payload.count.eq(out.payload.tag.count),
                    queue.i.payload.last.eq(out.payload.tag.last),
                    *([divider.i.payload.tag.layer.eq(layer), queue.i.payload.layer.eq(out.payload.tag.layer)]
                      if self.layers > 1 else []),
                ]
        # The words of a context still in the dividers or the queue.
        pending = Signal(range(words + 1))
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += pending.eq(pending - 1)

        # The query is copied on every idle cycle (so also on the one that takes it): its
        # enable is then one register, not the state decode and the input's valid.
        with m.If(idle):
            m.d.sync += q.eq(self.i.payload.q)
            if self.layers > 1:
                m.d.sync += layer.eq(self.i.payload.layer)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                # Group 0 is issued as the query is taken, unless it is the group of row pos
                # (whose K row may not be written yet).
                early = self.i.payload.pos >= rows
                with m.If(self.i.valid):
                    m.d.comb += issuing.eq(early)
                    m.d.sync += [pos.eq(self.i.payload.pos), idle.eq(0)]
                    m.d.comb += next_group.eq(early)
                    set_scoring(1)
                    m.next = "SCORE"
            # A pass issues the groups of rows 0..pos, one a cycle, then waits for its
            # pipeline to drain.
            for phase in ("SCORE", "WEIGHT"):
                with m.State(phase):
                    # The group of row pos waits for its K row (scores) or V row (weights).
                    ready = self.keys_ready if phase == "SCORE" else self.values_ready
                    m.d.comb += issuing.eq((group != last_group) | ready)
                    with m.If(issuing):
                        m.d.comb += next_group.eq(group + 1)
                        with m.If(group == last_group):
                            m.next = f"{phase}_DRAIN"
            with m.State("SCORE_DRAIN"):
                # The weight phase reads a row's score as it issues it, and works out its gap
                # from the maximum a cycle later (or two, the read held): it may start as the
                # last score reaches the last stage (or the one before), as its group's maximum
                # follows a cycle later and the running one a cycle after that, so that the
                # maximum is complete in time for row 0. A held read then costs no cycle, but
                # where the last group written is group 0: its block RAM's read would see its
                # score only a cycle later.
                drained = s_valid[:score_latency - 1] == 0
                if plan.score_read_stages:
                    drained = Mux(last_group == 0, drained, s_valid[:score_latency - 2] == 0)
                with m.If(drained):
                    m.d.comb += next_group.eq(0)
                    set_scoring(0)
                    m.next = "WEIGHT"
            with m.State("WEIGHT_DRAIN"):
                # The numerators are complete a cycle after the last row leaves the pipeline's
                # last stage but one (the dens stages earlier): the dividers take them from then.
                with m.If((w_valid[:weight_latency - 1] == 0) & (pending == 0)):
                    m.d.sync += [column.eq(0), pending.eq(words)]
                    set_context(1)
                    m.next = "CONTEXT"
            with m.State("CONTEXT"):
                m.d.sync += column.eq(column + ways)
                with m.If(column + ways >= d):
                    m.d.sync += idle.eq(1)
                    m.d.comb += next_group.eq(0)
                    set_context(0)
                    set_scoring(1)
                    m.next = "IDLE"
        return m
