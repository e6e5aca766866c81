from types import SimpleNamespace

from amaranth.hdl import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from plan.lanes import bank_words

from .fanout import global_net, replicas
from .fifo import SkidBuffer
from .loader import connect_load, load_port
from .product import dsp_product, lut_product, tree_sum

__all__ = ["MatVec"]


class MatVec(wiring.Component):
    """Matrix-vector products ``y[j] = Σ_e x[e] · W[e, j]`` over int8 matrices held in block RAM.

    Vectors move ``ways`` elements a cycle, in and out. ``lanes`` lanes work in parallel, each on
    one output column with ``ways`` multipliers, one per element of an input word: a matrix with
    ``rows`` rows and ``cols`` columns is computed in ``ceil(cols / lanes)`` groups of columns,
    each taking ``ceil(rows / ways)`` cycles, the input streamed in during the first group and
    replayed from a buffer for the others. Each lane reads its weights from one word of a
    memory that holds every matrix, word row by word row, group after group (in banks of
    lanes, :func:`plan.lanes.weight_table`), so the same lanes serve all the model's matrices in
    turn. A vector's last word may be partly empty (``rows`` not a multiple of ``ways``): the
    weight rows past the matrix are zero, so whatever the empty places hold adds nothing.

    Parameters
    ----------
    plan : :class:`plan.lanes.LanesPlan`
        The lanes, ways and LUT ways (of each lane's multipliers, the last ``lut_ways`` are
        made of LUT logic, :func:`.product.nibble_products`, rather than DSP blocks: a part
        with too few multipliers for the ways still takes them, at the same latency), the
        matrices and the order they usually come in (a cycle: the weight memory's address is a
        register, set to the next matrix's first word before its vector arrives, so a vector
        for another matrix waits one cycle), the accumulator's width (from each matrix's input
        bounds and weights), and ``whole``: a matrix whose sums leave a whole group at once on
        ``w`` rather than ``ways`` at a time on ``o`` (for a consumer that takes a group at
        once: the arg-max head). A plan with a hidden pair is :class:`~.matvec_hidden.HiddenMatVec`'s.
    weights : array ``[word, way, lane]``, or ``None``
        The weight memory's contents (:func:`plan.lanes.weight_table`); ``None``: zero.
    loadable : bool
        The weight memory takes writes, bank ``b``'s words on ``load<b>``
        (``In(load_port(depth, bank width))``): a loadable build's.

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"values": ArrayLayout(signed(8), ways), "matrix"})))``
        A vector's rows ``ways`` at a time, in order; ``matrix`` the same on each word.
    o : ``Out(stream.Signature(StructLayout({"acc", "column", "count", "matrix", "last"})))``
        The sums ``ways`` at a time in column order: ``acc[k]`` is column ``column + k``, the
        first ``count`` of them are the matrix's; ``last`` marks the vector's last word.
    w : ``Out(stream.Signature(StructLayout({"values", "count", "last"})))``, with ``whole``
        That matrix's sums a group at a time: ``values[l]`` is lane l's column of the group,
        the first ``count`` of them the matrix's; ``last`` marks the vector's last group.

    Latency: the first output word (or group, on ``w``) leaves 6 cycles after the last input
    word of the first group (one more for a vector out of ``order``). Throughput: one input
    word per cycle per group, one output word per cycle; with ``lanes <= rows`` the output
    never stalls the lanes.
    """

    REPLICA_LANES = 6  # lanes per copy of an input element

    def __init__(self, plan, weights=None, *, loadable=False):
        if plan.hidden is not None and type(self) is MatVec:
            raise ValueError("a plan with a hidden pair is HiddenMatVec's")
        self.plan = plan
        self.weights = weights
        self.loadable = loadable
        self.lanes, self.ways, self.lut_ways = plan.lanes, plan.ways, plan.lut_ways
        self.acc_bits = plan.acc_bits
        self.whole = plan.whole
        n = len(plan.matrices)
        whole_port = {} if plan.whole is None else {"w": Out(stream.Signature(data.StructLayout({
            "values": data.ArrayLayout(signed(plan.acc_bits), plan.lanes),
            "count": range(plan.lanes + 1),
            "last": 1,
        })))}
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "values": data.ArrayLayout(signed(8), plan.ways),
                "matrix": range(n),
            }))),
            "o": Out(stream.Signature(self.output_layout(plan))),
            **whole_port,
            **self._extra_ports(),
            # A loadable build's weights, a bank's word at a time.
            **({f"load{bank}": In(load_port(plan.depth, plan.bank_width(bank))) for bank in range(len(plan.banks))}
               if loadable else {}),
        })

    @staticmethod
    def output_layout(plan):
        return data.StructLayout({
            "acc": data.ArrayLayout(signed(plan.acc_bits), plan.ways),
            "column": range(max(plan.cols) + plan.lanes),
            "count": range(plan.ways + 1),
            "matrix": range(len(plan.matrices)),
            "last": 1,
        })

    def _extra_ports(self):
        return {}

    # -- Hooks for a variant (see HiddenMatVec): here, a plain MatVec's.

    def _flag_fields(self):
        """Fields that travel with each word down the pipeline, beside the plain ones."""
        return {}

    def _issue_control(self, m, s):
        """The input's readiness, and whether a word issues (``s.issue``)."""
        m.d.comb += [self.i.ready.eq(s.advance & ~s.replay & (~s.starting | s.as_expected)),
                     s.issue.eq(Mux(s.replay, s.advance, self.i.valid & self.i.ready))]

    def _issue_updates(self, m, s):
        """What else a word's issue updates."""

    def _issued_count(self, m, s, count):
        return count

    def _element(self, m, s, lane, element):
        """The element lane ``lane`` multiplies."""
        return element

    def _finishing(self, m, s):
        """Whether the word in the pipeline's last stage ends a group for the output buffer
        (``s.finishing``), and whether the word there next cycle ends a group
        (``s.next_ends``) for it (``s.next_finishing``)."""
        s.finishing = s.multiplied.valid & s.multiplied.last
        s.next_ends = s.next_finishing = s.next_valid & s.next_last

    def _room(self, m, s, next_out_free):
        """Whether a finished group may go to the output buffer next cycle."""
        return next_out_free

    def _accumulates(self, m, s, next_advance):
        """Whether the lanes add the word in the last stage to their sums next cycle."""
        return next_advance & s.next_valid & ~s.next_last

    def _lane_sums(self, m, s, lane, result):
        """Where else lane ``lane``'s sum goes."""

    def _after_lanes(self, m, s):
        """The sums' way out."""
        wiring.connect(m, s.output.o, wiring.flipped(self.o))

    def elaborate(self, platform):
        m = Module()
        plan = self.plan
        lanes, ways = self.lanes, self.ways
        n = len(plan.matrices)
        steps, groups, cols, order = plan.steps, plan.groups, plan.cols, list(plan.order)
        word_shape = data.ArrayLayout(signed(8), ways)
        s = SimpleNamespace(platform=platform)

        # The weights in banks of lanes, each read from its own copy of the address register,
        # placed near its block RAMs: one address reaching all of them takes a long route.
        # Block RAM however shallow: as a LUT ROM, a wide shallow memory costs thousands of LUTs.
        weight_reads = []
        for index in range(len(plan.banks)):
            init = [] if self.weights is None else bank_words(plan, self.weights, index)
            m.submodules[f"weights{index}"] = weights = memory.Memory(
                shape=unsigned(plan.bank_width(index)), depth=plan.depth, init=init,
                attrs={"ram_style": "block", "rom_style": "block"})
            weight_reads.append(weights.read_port())
            if self.loadable:
                connect_load(m, weights, getattr(self, f"load{index}"))
        # The read ports have one cycle of latency; they pause with the pipeline. (Reading a
        # word's weights by its issue instead would save a stage a product, but put the issue
        # decision into the address, and the block RAM's slow output before a select.)
        m.submodules.vector = vector = memory.Memory(shape=word_shape, depth=max(steps), init=[],
                                                     attrs={"ram_style": "distributed"})
        vector_write = vector.write_port()
        vector_read = vector.read_port()

        def constants(values, shape):
            return Array(Const(v, shape) for v in values)

        last_step = constants([x - 1 for x in steps], range(max(steps)))
        last_group = constants([g - 1 for g in groups], range(max(groups)))
        base = constants(plan.bases[:n], range(plan.depth + 1))
        successor = constants([order[(order.index(index) + 1) % len(order)] if index in order else order[0]
                               for index in range(n)], range(n))
        tail_cols = constants([c - (g - 1) * lanes for c, g in zip(cols, groups)], range(lanes + 1))
        s.last_col = constants([c - 1 for c in cols], range(max(cols)))

        s.advance = advance = Signal(init=1)  # the whole pipeline moves (a register: see the output)
        # ... and reaches every register of the lanes: on a global net where there is one.
        s.moving = moving = global_net(m, platform, advance, "lanes_advance")
        m.d.comb += [port.en.eq(moving) for port in weight_reads]
        m.d.comb += vector_read.en.eq(moving)

        # -- Issue: one input word per cycle, from the input stream (group 0) or the buffer (replay).
        s.replay = replay = Signal()
        s.step = step = Signal(range(max(steps)))
        group = Signal(range(max(groups)))
        matrix = Signal(range(n))
        s.col_base = col_base = Signal(range(max(cols) + lanes))
        # The address of the word issued next, ahead of the issue decision: between vectors,
        # the first word of the matrix expected next.
        s.expected = expected = Signal(range(n), init=order[0])
        addresses = replicas(range(plan.depth + 1), len(plan.banks), "weight_address", init=plan.bases[order[0]])
        self._issue_setup(m, s)

        s.starting = starting = ~replay & (step == 0) & (group == 0)
        s.as_expected = self.i.payload.matrix == expected
        s.current = current = Signal(range(n))
        m.d.comb += current.eq(Mux(starting, expected, matrix))
        s.issue = issue = Signal()
        self._issue_control(m, s)

        m.d.comb += [port.addr.eq(address) for port, address in zip(weight_reads, addresses)]
        m.d.comb += [
            vector_read.addr.eq(step),
            vector_write.addr.eq(step),
            vector_write.data.eq(self.i.payload.values),
            vector_write.en.eq(self.i.valid & self.i.ready),
        ]
        s.final_step = final_step = step == last_step[current]
        s.final_group = final_group = group == last_group[current]
        s.out_of_order = starting & self.i.valid & ~s.as_expected
        self._issue_updates(m, s)
        with m.If(s.out_of_order):
            # A vector out of order: its matrix's first word is addressed, it is issued next cycle.
            m.d.sync += expected.eq(self.i.payload.matrix)
            m.d.sync += [address.eq(base[self.i.payload.matrix]) for address in addresses]
        with m.If(issue):
            m.d.sync += matrix.eq(current)
            with m.If(final_step & final_group):
                m.d.sync += expected.eq(successor[current])
                m.d.sync += [address.eq(base[successor[current]]) for address in addresses]
            with m.Else():
                m.d.sync += [address.eq(address + 1) for address in addresses]
            with m.If(final_step):
                m.d.sync += step.eq(0)
                with m.If(final_group):
                    m.d.sync += [group.eq(0), replay.eq(0), col_base.eq(0)]
                with m.Else():
                    m.d.sync += [group.eq(group + 1), replay.eq(1), col_base.eq(col_base + lanes)]
            with m.Else():
                m.d.sync += step.eq(step + 1)

        # Flags that travel with each word down the pipeline.
        flags = data.StructLayout({
            "valid": 1, "first": 1, "last": 1, "matrix": range(n),
            "col_base": range(max(cols) + lanes), "count": range(lanes + 1), **self._flag_fields(),
        })
        s.issued = issued = Signal(flags)
        count = self._issued_count(m, s, Mux(final_group, tail_cols[current], lanes))
        m.d.comb += [
            issued.valid.eq(issue),
            issued.first.eq(step == 0),
            issued.last.eq(final_step),
            issued.matrix.eq(current),
            issued.col_base.eq(col_base),
            issued.count.eq(count),
        ]

        # -- Read: the weight word and the input word arrive.
        s.read = read = Signal(flags)
        direct = Signal(word_shape)
        from_input = Signal()
        with m.If(moving):
            m.d.sync += [read.eq(issued), direct.eq(self.i.payload.values), from_input.eq(~replay)]
        elements = Signal(word_shape)
        m.d.comb += elements.eq(Mux(from_input, direct, vector_read.data))

        # -- Operands: the block RAM's output goes straight into a register, not a multiplier.
        staged = Signal(flags)
        # Each element goes to `lanes` multipliers, spread over the part: a copy per
        # REPLICA_LANES lanes keeps each copy near its multipliers.
        s.copies = -(-lanes // self.REPLICA_LANES)
        staged_copies = [replicas(signed(8), s.copies, f"staged_element{k}") for k in range(ways)]
        staged_weights = [Signal.like(port.data, name=f"staged_weights{index}")
                          for index, port in enumerate(weight_reads)]
        self._stage_operands(m, s)
        with m.If(moving):
            m.d.sync += staged.eq(read)
            m.d.sync += [bank.eq(port.data) for bank, port in zip(staged_weights, weight_reads)]
            for k, copies in enumerate(staged_copies):
                m.d.sync += [copy.eq(elements[k]) for copy in copies]

        # -- Operands, then multiply: one int8 × int8 product per lane and element, from a pair of
        # operand registers of its own, so that the long routes end in a register: a DSP block's
        # own input registers (see operand_product), or registers beside a multiplier made of
        # LUT logic, whose two partial products are added in the next stage with the others.
        s.operands = operands = Signal(flags)
        s.multiplied = multiplied = Signal(flags)
        with m.If(moving):
            m.d.sync += [operands.eq(staged), multiplied.eq(operands)]
        terms = [[] for _ in range(lanes)]  # per lane: what its products of the word add up from
        s.way_terms = [[] for _ in range(ways)]  # per element: what its column adds up from
        for k in range(ways):
            in_luts = k >= ways - self.lut_ways
            for lane in range(lanes):
                element = self._element(m, s, lane, staged_copies[k][lane // self.REPLICA_LANES])
                index, place = divmod(lane, plan.BANK_LANES)
                byte = k * len(range(*plan.banks[index])) + place
                weight = staged_weights[index][8 * byte:8 * byte + 8].as_signed()
                if in_luts:
                    element_in = replicas(signed(8), 1, f"operand{k}_{lane}")[0]
                    weight_in = Signal(signed(8), name=f"weight{k}_{lane}")
                    with m.If(moving):
                        m.d.sync += [element_in.eq(element), weight_in.eq(weight)]
                    registers, product = lut_product(element_in, weight_in, name=f"product{k}_{lane}")
                else:
                    registers, product = dsp_product(m, platform, element, weight, enable=moving,
                                                     name=f"product{k}_{lane}")
                with m.If(moving):
                    m.d.sync += registers
                terms[lane] += product
                s.way_terms[k] += product

        # -- Accumulate: each lane adds the word's products to its sum in one stage, the adds
        # as a balanced tree (few carry chains in series); a group's last word lands in the
        # output buffer instead.
        accumulators = [Signal(signed(self.acc_bits), name=f"acc{lane}") for lane in range(lanes)]
        outputs = [Signal(signed(self.acc_bits), name=f"out{lane}") for lane in range(lanes)]
        out_count = Signal(range(lanes + 1))
        out_column = Signal(range(max(cols) + lanes))
        out_matrix = Signal(range(n))

        # The output leaves through a register slice: the consumer's readiness would otherwise
        # reach every lane's output register through the shift below.
        m.submodules.slice = s.output = output = SkidBuffer(self.o.payload.shape())
        taking = output.i.valid & output.i.ready
        # A group of the `whole` matrix leaves from registers of its own, loaded only with its
        # groups, and which do not shift: what `w` carries changes only with such a group (a
        # wide port that changes every cycle slows its simulation severalfold).
        held_whole = Signal()
        whole_sums = [Signal(signed(self.acc_bits), name=f"whole{lane}") for lane in range(lanes)]
        whole_count = Signal(range(lanes + 1))
        whole_last = Signal()
        if self.whole is None:
            taking_whole = 0
        else:
            taking_whole = self.w.valid & self.w.ready
            m.d.comb += [
                self.w.valid.eq(held_whole),
                self.w.payload.count.eq(whole_count),
                self.w.payload.last.eq(whole_last),
                *(self.w.payload.values[lane].eq(held) for lane, held in enumerate(whole_sums)),
            ]
            with m.If(taking_whole):
                m.d.sync += held_whole.eq(0)  # (a group is never loaded while one is held)

        # The lanes stall while a finished group waits for the output buffer. `advance` fans
        # out to every lane's registers, so it is a register itself, computed a cycle ahead
        # from the next cycle's state (and not from the consumer's readiness: in the engine
        # that depends on the lanes', since outputs feed the next input).
        out_free = Signal(init=1)  # out_count == 0
        s.next_valid = Mux(advance, operands.valid, multiplied.valid)
        s.next_last = Mux(advance, operands.last, multiplied.last)
        s.next_matrix = Mux(advance, operands.matrix, multiplied.matrix)
        self._finishing(m, s)
        next_out_free = Mux(advance & s.finishing, 0, Mux(taking, out_count <= ways, out_free | taking_whole))
        next_room = self._room(m, s, next_out_free)
        next_advance = ~(s.next_finishing & ~next_room)
        # The lanes' enables, registered for the same reason.
        accumulate = Signal()  # advance & multiplied.valid & ~multiplied.last
        load = Signal()        # advance & finishing: the group's sums go to the output buffer
        load_whole = Signal()  # ... and it is a group of the `whole` matrix
        # multiplied.first: a group's first word starts the sum afresh. It selects in every
        # lane's adder: a copy per REPLICA_LANES lanes, each near its lanes.
        first = replicas(unsigned(1), s.copies, "lanes_first")
        m.d.sync += [
            out_free.eq(next_out_free),
            advance.eq(next_advance),
            accumulate.eq(self._accumulates(m, s, next_advance)),
            load.eq(s.next_finishing & next_room),
            *(copy.eq(Mux(advance, operands.first, multiplied.first)) for copy in first),
        ]

        accumulating = global_net(m, platform, accumulate, "lanes_accumulate")
        loading = global_net(m, platform, load, "lanes_load")
        if self.whole is not None:
            m.d.sync += load_whole.eq(s.next_finishing & next_room & (s.next_matrix == self.whole))
            loading_whole = global_net(m, platform, load_whole, "lanes_load_whole")
        for lane, (acc, out, held, lane_terms) in enumerate(zip(accumulators, outputs, whole_sums, terms)):
            result = tree_sum(lane_terms + [Mux(first[lane // self.REPLICA_LANES], 0, acc)])
            with m.If(accumulating):
                m.d.sync += acc.eq(result)
            with m.If(loading):
                m.d.sync += out.eq(result)
            if self.whole is not None:
                with m.If(loading_whole):
                    m.d.sync += held.eq(result)
            self._lane_sums(m, s, lane, result)

        m.d.comb += [
            output.i.valid.eq(~out_free & ~held_whole),
            output.i.payload.column.eq(out_column),
            output.i.payload.count.eq(Mux(out_count < ways, out_count, ways)),
            output.i.payload.matrix.eq(out_matrix),
            output.i.payload.last.eq(out_column + ways > s.last_col[out_matrix]),
        ]
        for k in range(ways):
            m.d.comb += output.i.payload.acc[k].eq(outputs[k])
        with m.If(load):
            m.d.sync += [
                out_count.eq(multiplied.count),
                out_column.eq(multiplied.col_base),
                out_matrix.eq(multiplied.matrix),
            ]
        with m.Elif(taking):
            m.d.sync += [out_count.eq(Mux(out_count < ways, 0, out_count - ways)),
                         out_column.eq(out_column + ways)]
        with m.If(load_whole):
            m.d.sync += [
                held_whole.eq(1),
                whole_count.eq(multiplied.count),
                whole_last.eq(multiplied.col_base + lanes > s.last_col[multiplied.matrix]),
            ]
        # Shift the buffer down: the next word's sums move to the output.
        shifting = global_net(m, platform, taking & ~load, "lanes_shift")
        with m.If(shifting):
            for here, after in zip(outputs, outputs[ways:]):
                m.d.sync += here.eq(after)

        self._after_lanes(m, s)
        return m

    def _issue_setup(self, m, s):
        """Signals a variant's issue needs before the issue is decided."""

    def _stage_operands(self, m, s):
        """What a variant stages beside the operands."""
