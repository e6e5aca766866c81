import numpy as np
from amaranth.hdl import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from int8model.bounds import Bound, matvec_bound

from .fifo import SkidBuffer, StreamFIFO
from .fanout import global_net, replicas
from .product import dsp_product, lut_product, tree_sum
from .requant import ConstantRequant

__all__ = ["MatVec"]

INT8 = Bound(-128, 127)


def _rounds(terms, fan_in):
    """Rounds of adding ``fan_in`` terms at a time into registers, until one is left (at least one)."""
    rounds = 0
    while terms > 1:
        terms, rounds = -(-terms // fan_in), rounds + 1
    return max(1, rounds)


class MatVec(wiring.Component):
    """Matrix-vector products ``y[j] = Σ_e x[e] · W[e, j]`` over int8 matrices held in block RAM.

    Vectors move ``ways`` elements a cycle, in and out. ``lanes`` lanes work in parallel, each on
    one output column with ``ways`` multipliers, one per element of an input word: a matrix with
    ``rows`` rows and ``cols`` columns is computed in ``ceil(cols / lanes)`` groups of columns,
    each taking ``ceil(rows / ways)`` cycles, the input streamed in during the first group and
    replayed from a buffer for the others. Each lane reads its weights from one word of a
    memory that holds every matrix, word row by word row, group after group (in banks of
    ``BANK_LANES`` lanes, see :meth:`weight_banks`), so the same lanes serve all the model's
    matrices in turn.

    A vector's last word may be partly empty (``rows`` not a multiple of ``ways``): the weight
    rows past the matrix are zero, so whatever the empty places hold adds nothing.

    Parameters
    ----------
    matrices : list of 2-D integer arrays (rows × cols, input-major), values in int8
    lanes : int, a multiple of ``ways`` (so that no output word spans two groups)
    ways : int
    lut_ways : int
        Of each lane's ``ways`` multipliers, how many (the last) are made of LUT logic
        (:func:`.product.nibble_products`) rather than DSP blocks: a part with too few
        multipliers for the ways still takes them. Same latency either way.
    input_bounds : list of :class:`~int8model.bounds.Bound`, one per matrix
        The range of that matrix's input elements (int8 by default); with the weights it
        bounds the accumulator, whose width is derived from it.
    order : list of matrix indices
        The order in which vectors usually come, as a cycle (all the matrices in turn by
        default). The weight memory's address is a register, set to the next matrix's first
        word before its vector arrives: a vector for another matrix waits one cycle.
    whole : matrix index or ``None``
        A matrix whose sums leave a whole group at once on ``w``, rather than ``ways`` at a
        time on ``o``: for a consumer that takes a group at once (the arg-max head).
    hidden : ``(first, second, rules, bound)`` or ``None``
        Two matrices in a chain, ``second · rules(first · x)`` (the FFN's W1 and W2): the
        first's sums, a whole group at once, go through the :class:`~.requant.Rule` chain
        ``rules`` (for sums in ``bound``) in LUT logic (:class:`~.requant.ConstantRequant`),
        into one operand register per lane; the second then takes that vector as it stands,
        lane ``l`` multiplying its element ``l`` by the weights of row ``l`` in each of its
        ``ways`` multipliers, a word of output columns a cycle, each column's sum across the
        lanes added up in a tree. The hidden vector never leaves the lanes, and the second
        product's first word leaves while it would otherwise still be streaming in. Its
        vector comes on ``i`` as the first's (the first's sums do not leave); the second
        follows the first in ``order``, and comes on ``i`` never. Its sums leave on ``o``
        through a queue with room for all of them, behind the output buffer's; the first's
        next vector waits until they have left. The first's columns and the second's rows
        fit the lanes.

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
    hidden_valid : ``Out(1)``, hidden_vector : ``Out(ArrayLayout(signed(8), lanes))``, with ``hidden``
        The hidden vector, lane l's element l, in the one cycle ``hidden_valid`` says it is
        made: for observers, nothing waits on them.

    Latency: the first output word (or group, on ``w``) leaves 6 cycles after the last input
    word of the first group (one more for a vector out of ``order``); with ``hidden``, the
    second's first word ``hidden_latency`` cycles after the first's last input word.
    Throughput: one input word per cycle per group, one output word per cycle; with
    ``lanes <= rows`` the output never stalls the lanes.
    """

    REPLICA_LANES = 6  # lanes per copy of an input element
    BANK_LANES = 8     # lanes per bank of the weight memory, each with its own address register
    COLUMN_FAN_IN = 4  # terms added into one register of a column's sum across the lanes (`hidden`)

    def __init__(self, matrices, lanes, *, ways=1, lut_ways=0, input_bounds=None, order=None, whole=None,
                 hidden=None):
        self.matrices = [np.asarray(w, dtype=np.int64) for w in matrices]
        if not self.matrices:
            raise ValueError("MatVec needs at least one matrix")
        for w in self.matrices:
            if w.ndim != 2 or w.size == 0 or w.min() < -128 or w.max() > 127:
                raise ValueError("every matrix is a non-empty 2-D int8 array")
        if ways < 1 or lanes < 1 or lanes % ways:
            raise ValueError(f"{lanes} lanes and {ways} ways: the lanes must be a multiple of the ways")
        if not 0 <= lut_ways <= ways:
            raise ValueError(f"{lut_ways} of {ways} ways in LUTs: it takes 0 to {ways}")
        self.lanes, self.ways, self.lut_ways = lanes, ways, lut_ways
        self.order = list(range(len(self.matrices))) if order is None else [int(index) for index in order]
        if not self.order or sorted(set(self.order)) != sorted(self.order) or \
                not all(0 <= index < len(self.matrices) for index in self.order):
            raise ValueError(f"order {self.order}: distinct indices of the {len(self.matrices)} matrices")
        if whole is not None and not 0 <= whole < len(self.matrices):
            raise ValueError(f"whole {whole}: an index of the {len(self.matrices)} matrices")
        self.whole = whole
        self.rows = [w.shape[0] for w in self.matrices]
        self.cols = [w.shape[1] for w in self.matrices]
        self.hidden = hidden
        if hidden is not None:
            first, second, rules, _ = hidden
            n = len(self.matrices)
            if not (0 <= first < n and 0 <= second < n and first != second and whole not in (first, second)):
                raise ValueError(f"hidden {first}, {second}: two indices of the {n} matrices, neither the whole one")
            if self.cols[first] > lanes or self.rows[second] > lanes or self.cols[first] != self.rows[second]:
                raise ValueError(f"hidden: the first's {self.cols[first]} columns are the second's "
                                 f"{self.rows[second]} rows, and fit the {lanes} lanes")
            if first not in self.order or self.order[(self.order.index(first) + 1) % len(self.order)] != second:
                raise ValueError(f"hidden: matrix {second} follows matrix {first} in order {self.order}")
            if not rules:
                raise ValueError("hidden: at least one rule")
        # Input words (or, for the second of `hidden`, output words) a group, and groups.
        self.steps = [-(-r // ways) for r in self.rows]
        self.groups = [-(-c // lanes) for c in self.cols]
        if hidden is not None:
            self.steps[hidden[1]], self.groups[hidden[1]] = -(-self.cols[hidden[1]] // ways), 1
            # The first's last word reaches the hidden sums 5 cycles after its issue, the rules
            # take their stages, and the second's first word meets the vector at the operands
            # 2 cycles after its issue: so many idle cycles between the two.
            self.hidden_lead = 2 + ConstantRequant.latency(hidden[2])
            # A column's terms: a DSP product a lane, or a LUT product's two halves.
            self.column_stages = _rounds(lanes * (2 if lut_ways else 1), self.COLUMN_FAN_IN)
            self.hidden_latency = self.hidden_lead + 5 + self.column_stages
        self.bases = np.cumsum([0] + [s * g for s, g in zip(self.steps, self.groups)]).tolist()
        self.depth = self.bases[-1]
        input_bounds = input_bounds or [INT8] * len(self.matrices)
        self.acc_bound = Bound(
            min(matvec_bound(b, w).lo for b, w in zip(input_bounds, self.matrices)),
            max(matvec_bound(b, w).hi for b, w in zip(input_bounds, self.matrices)))
        self.acc_bits = self.acc_bound.bits
        n = len(self.matrices)
        whole_port = {} if whole is None else {"w": Out(stream.Signature(data.StructLayout({
            "values": data.ArrayLayout(signed(self.acc_bits), lanes),
            "count": range(lanes + 1),
            "last": 1,
        })))}
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "values": data.ArrayLayout(signed(8), ways),
                "matrix": range(n),
            }))),
            "o": Out(stream.Signature(data.StructLayout({
                "acc": data.ArrayLayout(signed(self.acc_bits), ways),
                "column": range(max(self.cols) + lanes),
                "count": range(ways + 1),
                "matrix": range(n),
                "last": 1,
            }))),
            **whole_port,
            # The hidden vector, for observers (it goes nowhere else): valid in the cycle it is made.
            **({} if hidden is None else {"hidden_valid": Out(1),
                                          "hidden_vector": Out(data.ArrayLayout(signed(8), lanes))}),
        })

    def weight_table(self):
        """The weight memory's contents: ``[word, k, lane]``, one word per (matrix, group, step),
        lane l's weight for the step's element k (zero past the matrix); for the second of
        ``hidden``, one word per output word, lane l's weight of row l for the word's column k."""
        table = np.zeros((self.depth, self.ways, self.lanes), dtype=np.int64)
        word = 0
        for index, (w, groups, steps) in enumerate(zip(self.matrices, self.groups, self.steps)):
            if self.hidden is not None and index == self.hidden[1]:
                w = w.T  # rows become lanes, columns elements
            for g in range(groups):
                for step in range(steps):
                    block = w[step * self.ways:(step + 1) * self.ways, g * self.lanes:(g + 1) * self.lanes]
                    table[word, :block.shape[0], :block.shape[1]] = block
                    word += 1
        return table

    @classmethod
    def weight_banks(cls, lanes):
        """The lanes of each bank of the weight memory, as ranges: ``BANK_LANES`` each, the
        last the rest."""
        return [range(first, min(first + cls.BANK_LANES, lanes)) for first in range(0, lanes, cls.BANK_LANES)]

    @property
    def multipliers(self):
        """The lanes' products a cycle."""
        return self.lanes * self.ways

    def elaborate(self, platform):
        m = Module()
        lanes, ways = self.lanes, self.ways
        n = len(self.matrices)
        word_shape = data.ArrayLayout(signed(8), ways)

        # The weights in banks of BANK_LANES lanes, each read from its own copy of the address
        # register, placed near its block RAMs: one address reaching all of them takes a
        # long route. Block RAM however shallow: as a LUT ROM, a wide shallow memory costs
        # thousands of LUTs. A bank's word: lane l's weight for element k in byte k · its lanes + l.
        table = self.weight_table()
        banks = self.weight_banks(lanes)
        weight_reads = []
        for index, bank in enumerate(banks):
            bank_table = table[:, :, bank.start:bank.stop].reshape(self.depth, -1)
            init = [sum((int(byte) & 0xff) << (8 * at) for at, byte in enumerate(word)) for word in bank_table]
            m.submodules[f"weights{index}"] = weights = memory.Memory(
                shape=unsigned(8 * ways * len(bank)), depth=self.depth, init=init,
                attrs={"ram_style": "block", "rom_style": "block"})
            weight_reads.append(weights.read_port())
        # The read ports have one cycle of latency; they pause with the pipeline. (Reading a
        # word's weights by its issue instead saves a stage a product, but on the 85F the issue
        # decision into the address took 11.95 ns, and entries of a word and its follower put
        # the block RAM's slow output, 5.8 ns, and a long route before a select: 88.7 MHz.)
        m.submodules.vector = vector = memory.Memory(shape=word_shape, depth=max(self.steps), init=[])
        vector_write = vector.write_port()
        vector_read = vector.read_port()

        def constants(values, shape):
            return Array(Const(v, shape) for v in values)

        last_step = constants([s - 1 for s in self.steps], range(max(self.steps)))
        last_group = constants([g - 1 for g in self.groups], range(max(self.groups)))
        base = constants(self.bases[:n], range(self.depth + 1))
        successor = constants([self.order[(self.order.index(index) + 1) % len(self.order)]
                               if index in self.order else self.order[0] for index in range(n)], range(n))
        tail_cols = constants([c - (g - 1) * lanes for c, g in zip(self.cols, self.groups)], range(lanes + 1))
        last_col = constants([c - 1 for c in self.cols], range(max(self.cols)))

        advance = Signal(init=1)  # the whole pipeline moves (a register: see the output)
        # ... and reaches every register of the lanes: on a global net where there is one.
        moving = global_net(m, platform, advance, "lanes_advance")
        m.d.comb += [port.en.eq(moving) for port in weight_reads]
        m.d.comb += vector_read.en.eq(moving)

        # -- Issue: one input word per cycle, from the input stream (group 0) or the buffer
        # (replay); or, for the second of `hidden`, one output word per cycle, issued by the
        # lanes themselves (`inner`).
        replay = Signal()
        step = Signal(range(max(self.steps)))
        group = Signal(range(max(self.groups)))
        matrix = Signal(range(n))
        col_base = Signal(range(max(self.cols) + lanes))
        # The address of the word issued next, ahead of the issue decision: between vectors,
        # the first word of the matrix expected next.
        expected = Signal(range(n), init=self.order[0])
        addresses = replicas(range(self.depth + 1), len(banks), "weight_address", init=self.bases[self.order[0]])

        if self.hidden is not None:
            inner = Signal()         # the second of `hidden` is being issued, after `waiting` idle cycles
            hidden_ahead = Signal()  # the second's words are still in the lanes or the output queue (a register)
            first_matrix, second_matrix, rules, bound = self.hidden
            # Each lane's sum of the first, through the rules in LUT logic, free-running: what
            # the second's lane multiplies (the register holds until the next such sum).
            hidden_sums = [Signal(signed(self.acc_bits), name=f"hidden{lane}") for lane in range(lanes)]
            requants = [ConstantRequant(m, hidden_sums[lane], bound, rules, enable=1, name=f"hidden{lane}")
                        for lane in range(lanes)]
            hidden_vector = [requant.result for requant in requants]
            lead = self.hidden_lead
            waiting = Signal(range(lead + 1))
            blocked = (expected == first_matrix) & hidden_ahead  # the first waits for the second's last words
        else:
            inner = hidden_ahead = first_matrix = second_matrix = None

        starting = ~replay & (step == 0) & (group == 0)
        as_expected = self.i.payload.matrix == expected
        current = Signal(range(n))
        m.d.comb += current.eq(Mux(starting, expected, matrix))
        issue = Signal()
        if self.hidden is None:
            m.d.comb += [self.i.ready.eq(advance & ~replay & (~starting | as_expected)),
                         issue.eq(Mux(replay, advance, self.i.valid & self.i.ready))]
        else:
            # `internal`: replay | inner, a register of its own, so that the input's valid meets
            # one decision on its way to the issue (the path from the epilogue through the feed
            # queue into the issue is among the design's slowest).
            internal = Signal()
            m.d.comb += [self.i.ready.eq(advance & ~internal & (~starting | (as_expected & ~blocked))),
                         issue.eq(Mux(internal, advance & (~inner | (waiting == 0)), self.i.valid & self.i.ready))]

        m.d.comb += [port.addr.eq(address) for port, address in zip(weight_reads, addresses)]
        m.d.comb += [
            vector_read.addr.eq(step),
            vector_write.addr.eq(step),
            vector_write.data.eq(self.i.payload.values),
            vector_write.en.eq(self.i.valid & self.i.ready),
        ]
        final_step = step == last_step[current]
        final_group = group == last_group[current]
        out_of_order = starting & self.i.valid & ~as_expected
        if self.hidden is not None:
            out_of_order &= ~inner
        with m.If(out_of_order):
            # A vector out of order: its matrix's first word is addressed, it is issued next cycle.
            m.d.sync += expected.eq(self.i.payload.matrix)
            m.d.sync += [address.eq(base[self.i.payload.matrix]) for address in addresses]
        if self.hidden is not None:
            with m.If(inner & advance & (waiting != 0)):
                m.d.sync += waiting.eq(waiting - 1)
        with m.If(issue):
            m.d.sync += matrix.eq(current)
            with m.If(final_step & final_group):
                m.d.sync += expected.eq(successor[current])
                m.d.sync += [address.eq(base[successor[current]]) for address in addresses]
                if self.hidden is not None:
                    # The first's last word: the second's follow, once the vector is made.
                    m.d.sync += [inner.eq(current == first_matrix), waiting.eq(lead)]
            with m.Else():
                m.d.sync += [address.eq(address + 1) for address in addresses]
            with m.If(final_step):
                m.d.sync += step.eq(0)
                with m.If(final_group):
                    m.d.sync += [group.eq(0), replay.eq(0), col_base.eq(0)]
                    if self.hidden is not None:
                        m.d.sync += internal.eq(current == first_matrix)
                with m.Else():
                    m.d.sync += [group.eq(group + 1), replay.eq(1), col_base.eq(col_base + lanes)]
                    if self.hidden is not None:
                        m.d.sync += internal.eq(1)
            with m.Else():
                m.d.sync += step.eq(step + 1)
                if self.hidden is not None:
                    with m.If(inner):
                        m.d.sync += col_base.eq(col_base + ways)  # the second's words are words of columns

        # Stage flags that travel with each word down the pipeline (`stationary`: a word of
        # the second of `hidden`).
        flags = data.StructLayout({
            "valid": 1, "first": 1, "last": 1, "matrix": range(n),
            "col_base": range(max(self.cols) + lanes), "count": range(lanes + 1),
            **({} if self.hidden is None else {"stationary": 1}),
        })
        issued = Signal(flags)
        count = Mux(final_group, tail_cols[current], lanes)
        if self.hidden is not None:
            inner_tail = self.cols[second_matrix] - (self.steps[second_matrix] - 1) * ways
            count = Mux(inner, Mux(final_step, inner_tail, ways), count)
            m.d.comb += issued.stationary.eq(inner)
        m.d.comb += [
            issued.valid.eq(issue),
            issued.first.eq(step == 0),
            issued.last.eq(final_step),
            issued.matrix.eq(current),
            issued.col_base.eq(col_base),
            issued.count.eq(count),
        ]

        # -- Read: the weight word and the input word arrive.
        read = Signal(flags)
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
        copies = -(-lanes // self.REPLICA_LANES)
        staged_copies = [replicas(signed(8), copies, f"staged_element{k}") for k in range(ways)]
        staged_weights = [Signal.like(port.data, name=f"staged_weights{index}")
                          for index, port in enumerate(weight_reads)]
        if self.hidden is not None:
            # Whether the operands are the hidden vector's (the second of `hidden`): a copy per
            # REPLICA_LANES lanes too.
            stationary = replicas(unsigned(1), copies, "staged_stationary")
        with m.If(moving):
            m.d.sync += staged.eq(read)
            m.d.sync += [bank.eq(port.data) for bank, port in zip(staged_weights, weight_reads)]
            for k, copies in enumerate(staged_copies):
                m.d.sync += [copy.eq(elements[k]) for copy in copies]
            if self.hidden is not None:
                m.d.sync += [copy.eq(read.stationary) for copy in stationary]

        # -- Operands, then multiply: one int8 × int8 product per lane and element, from a pair of
        # operand registers of its own, so that the long routes end in a register: a DSP block's
        # own input registers (see operand_product), or registers beside a multiplier made of
        # LUT logic, whose two partial products are added in the next stage with the others.
        operands = Signal(flags)
        multiplied = Signal(flags)
        with m.If(moving):
            m.d.sync += [operands.eq(staged), multiplied.eq(operands)]
        terms = [[] for _ in range(lanes)]  # per lane: what its products of the word add up from
        way_terms = [[] for _ in range(ways)]  # per element: what its column adds up from (`hidden`)
        for k in range(ways):
            in_luts = k >= ways - self.lut_ways
            for lane in range(lanes):
                element = staged_copies[k][lane // self.REPLICA_LANES]
                if self.hidden is not None:
                    element = Mux(stationary[lane // self.REPLICA_LANES], hidden_vector[lane], element)
                index, place = divmod(lane, self.BANK_LANES)
                byte = k * len(banks[index]) + place
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
                way_terms[k] += product

        # -- Accumulate: each lane adds the word's products to its sum in one stage, the adds
        # as a balanced tree (few carry chains in series); a group's last word lands in the
        # output buffer instead.
        accumulators = [Signal(signed(self.acc_bits), name=f"acc{lane}") for lane in range(lanes)]
        outputs = [Signal(signed(self.acc_bits), name=f"out{lane}") for lane in range(lanes)]
        out_count = Signal(range(lanes + 1))
        out_column = Signal(range(max(self.cols) + lanes))
        out_matrix = Signal(range(n))

        # The output leaves through a register slice: the consumer's readiness would otherwise
        # reach every lane's output register through the shift below.
        m.submodules.slice = output = SkidBuffer(self.o.payload.shape())
        if self.hidden is None:
            wiring.connect(m, output.o, wiring.flipped(self.o))
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
        # A group's last word of the first of `hidden` goes to the hidden sums, which are
        # always free; a word of the second to the column sums, and never stalls.
        out_free = Signal(init=1)  # out_count == 0
        next_valid = Mux(advance, operands.valid, multiplied.valid)
        next_last = Mux(advance, operands.last, multiplied.last)
        next_matrix = Mux(advance, operands.matrix, multiplied.matrix)
        finishing = multiplied.valid & multiplied.last
        next_ends = next_finishing = next_valid & next_last
        if self.hidden is not None:
            next_stationary = Mux(advance, operands.stationary, multiplied.stationary)
            finishing = finishing & ~multiplied.stationary & (multiplied.matrix != first_matrix)
            next_ends = next_ends & ~next_stationary
            next_finishing = next_ends & (next_matrix != first_matrix)
        next_out_free = Mux(advance & finishing, 0, Mux(taking, out_count <= ways, out_free | taking_whole))
        next_room = next_out_free
        if self.hidden is not None:
            # Sums for `o` also wait for the second's words ahead of them, which leave first.
            next_room = next_out_free & (~hidden_ahead | (next_matrix == self.whole if self.whole is not None else 0))
        next_advance = ~(next_finishing & ~next_room)
        next_accumulates = next_advance & next_valid & ~next_last
        if self.hidden is not None:
            next_accumulates = next_accumulates & ~next_stationary
        # The lanes' enables, registered for the same reason.
        accumulate = Signal()  # advance & multiplied.valid & ~multiplied.last (not the second's)
        load = Signal()        # advance & finishing: the group's sums go to the output buffer
        load_whole = Signal()  # ... and it is a group of the `whole` matrix
        load_hidden = Signal()  # ... of the first of `hidden`: to the hidden sums
        # multiplied.first: a group's first word starts the sum afresh. It selects in every
        # lane's adder: a copy per REPLICA_LANES lanes, each near its lanes.
        first = replicas(unsigned(1), -(-lanes // self.REPLICA_LANES), "lanes_first")
        m.d.sync += [
            out_free.eq(next_out_free),
            advance.eq(next_advance),
            accumulate.eq(next_accumulates),
            load.eq(next_finishing & next_room),
            *(copy.eq(Mux(advance, operands.first, multiplied.first)) for copy in first),
        ]

        accumulating = global_net(m, platform, accumulate, "lanes_accumulate")
        loading = global_net(m, platform, load, "lanes_load")
        if self.whole is not None:
            m.d.sync += load_whole.eq(next_finishing & next_room & (next_matrix == self.whole))
            loading_whole = global_net(m, platform, load_whole, "lanes_load_whole")
        if self.hidden is not None:
            m.d.sync += load_hidden.eq(next_ends & (next_matrix == first_matrix))
            loading_hidden = global_net(m, platform, load_hidden, "lanes_load_hidden")
        for lane, (acc, out, held, lane_terms) in enumerate(zip(accumulators, outputs, whole_sums, terms)):
            result = tree_sum(lane_terms + [Mux(first[lane // self.REPLICA_LANES], 0, acc)])
            with m.If(accumulating):
                m.d.sync += acc.eq(result)
            with m.If(loading):
                m.d.sync += out.eq(result)
            if self.whole is not None:
                with m.If(loading_whole):
                    m.d.sync += held.eq(result)
            if self.hidden is not None:
                with m.If(loading_hidden):
                    m.d.sync += hidden_sums[lane].eq(result)
        if self.hidden is not None:
            made = loading_hidden
            for stage in range(self.hidden_lead - 1):  # the sums' register, then the rules' stages
                later = Signal(name=f"hidden_made{stage}")
                m.d.sync += later.eq(made)
                made = later
            m.d.comb += [self.hidden_valid.eq(made),
                         *(self.hidden_vector[lane].eq(value) for lane, value in enumerate(hidden_vector))]

        m.d.comb += [
            output.i.valid.eq(~out_free & ~held_whole),
            output.i.payload.column.eq(out_column),
            output.i.payload.count.eq(Mux(out_count < ways, out_count, ways)),
            output.i.payload.matrix.eq(out_matrix),
            output.i.payload.last.eq(out_column + ways > last_col[out_matrix]),
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
                whole_last.eq(multiplied.col_base + lanes > last_col[multiplied.matrix]),
            ]
        # Shift the buffer down: the next word's sums move to the output.
        shifting = global_net(m, platform, taking & ~load, "lanes_shift")
        with m.If(shifting):
            for here, after in zip(outputs, outputs[ways:]):
                m.d.sync += here.eq(after)

        if self.hidden is not None:
            self._column_sums(m, multiplied, moving, way_terms, output, inner, waiting, advance, hidden_ahead)
        return m

    def _column_sums(self, m, multiplied, moving, way_terms, output, inner, waiting, advance, hidden_ahead):
        """The second of `hidden`: each column's sum across the lanes, a tree of registers
        ``COLUMN_FAN_IN`` terms each, from the products as they leave the pipeline's last
        stage (then free-running: its words never wait on a stalled lane), into a queue with
        room for a whole vector; on `o`, the output buffer's sums first (they are older)."""
        ways, second = self.ways, self.hidden[1]
        words = self.steps[second]
        word = data.StructLayout({"valid": 1, "col_base": range(max(self.cols) + self.lanes),
                                  "count": range(self.lanes + 1), "last": 1})
        sums = [list(terms) for terms in way_terms]
        tag = Signal(word, name="column_word0")
        m.d.sync += [tag.valid.eq(multiplied.valid & multiplied.stationary & moving),
                     tag.col_base.eq(multiplied.col_base), tag.count.eq(multiplied.count),
                     tag.last.eq(multiplied.last)]
        for stage in range(self.column_stages):
            for k in range(ways):
                groups = [sums[k][at:at + self.COLUMN_FAN_IN] for at in range(0, len(sums[k]), self.COLUMN_FAN_IN)]
                registers = [Signal(signed(self.acc_bits), name=f"column{k}_sum{stage}_{at}")
                             for at in range(len(groups))]
                m.d.sync += [register.eq(tree_sum(group)) for register, group in zip(registers, groups)]
                sums[k] = registers
            if stage:
                later = Signal(word, name=f"column_word{stage}")
                m.d.sync += later.eq(tag)
                tag = later
        m.submodules.columns = queue = StreamFIFO(self.o.payload.shape(), words, fall_through=True)
        m.d.comb += [
            queue.i.valid.eq(tag.valid),
            queue.i.payload.column.eq(tag.col_base),
            queue.i.payload.count.eq(tag.count),
            queue.i.payload.matrix.eq(second),
            queue.i.payload.last.eq(tag.last),
            *(queue.i.payload.acc[k].eq(sums[k][0]) for k in range(ways)),
        ]
        # The older sums first: the output buffer's, then the queue's.
        with m.If(output.o.valid):
            m.d.comb += [self.o.valid.eq(1), self.o.payload.eq(output.o.payload), output.o.ready.eq(self.o.ready)]
        with m.Else():
            m.d.comb += [self.o.valid.eq(queue.o.valid), self.o.payload.eq(queue.o.payload),
                         queue.o.ready.eq(self.o.ready)]
        # The second's words issued and not yet taken: a first's vector waits for none to be
        # left. Counted, and judged, from registers (the input's readiness depends on it).
        outstanding = Signal(range(words + 1))
        left = ~output.o.valid & queue.o.valid & self.o.ready
        counted = outstanding + (inner & advance & (waiting == 0)) - left
        m.d.sync += [outstanding.eq(counted), hidden_ahead.eq(counted != 0)]
