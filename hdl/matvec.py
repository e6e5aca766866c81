import numpy as np
from amaranth.hdl import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from int8model.bounds import Bound, matvec_bound

from .fifo import SkidBuffer
from .fanout import global_net, replicas
from .product import dsp_product, lut_product, tree_sum

__all__ = ["MatVec"]

INT8 = Bound(-128, 127)


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
    word of the first group (one more for a vector out of ``order``).
    Throughput: one input word per cycle per group, one output word per cycle; with
    ``lanes <= rows`` the output never stalls the lanes.
    """

    REPLICA_LANES = 6  # lanes per copy of an input element
    BANK_LANES = 8     # lanes per bank of the weight memory, each with its own address register

    def __init__(self, matrices, lanes, *, ways=1, lut_ways=0, input_bounds=None, order=None, whole=None):
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
        self.steps = [-(-r // ways) for r in self.rows]
        self.groups = [-(-c // lanes) for c in self.cols]
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
        })

    def weight_table(self):
        """The weight memory's contents: ``[word, k, lane]``, one word per (matrix, group, step),
        lane l's weight for the step's element k (zero past the matrix)."""
        table = np.zeros((self.depth, self.ways, self.lanes), dtype=np.int64)
        word = 0
        for w, groups, steps in zip(self.matrices, self.groups, self.steps):
            rows, cols = w.shape
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
        # The read ports have one cycle of latency; they pause with the pipeline.
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

        # -- Issue: one input word per cycle, from the input stream (group 0) or the buffer (replay).
        replay = Signal()
        step = Signal(range(max(self.steps)))
        group = Signal(range(max(self.groups)))
        matrix = Signal(range(n))
        col_base = Signal(range(max(self.cols) + lanes))
        # The address of the word issued next, ahead of the issue decision: between vectors,
        # the first word of the matrix expected next.
        expected = Signal(range(n), init=self.order[0])
        addresses = replicas(range(self.depth + 1), len(banks), "weight_address", init=self.bases[self.order[0]])

        starting = ~replay & (step == 0) & (group == 0)
        as_expected = self.i.payload.matrix == expected
        current = Signal(range(n))
        m.d.comb += current.eq(Mux(starting, expected, matrix))
        m.d.comb += self.i.ready.eq(advance & ~replay & (~starting | as_expected))
        issue = Signal()
        m.d.comb += issue.eq(Mux(replay, advance, self.i.valid & self.i.ready))

        m.d.comb += [port.addr.eq(address) for port, address in zip(weight_reads, addresses)]
        m.d.comb += [
            vector_read.addr.eq(step),
            vector_write.addr.eq(step),
            vector_write.data.eq(self.i.payload.values),
            vector_write.en.eq(self.i.valid & self.i.ready),
        ]
        final_step = step == last_step[current]
        final_group = group == last_group[current]
        with m.If(starting & self.i.valid & ~as_expected):
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

        # Stage flags that travel with each word down the pipeline.
        flags = data.StructLayout({
            "valid": 1, "first": 1, "last": 1, "matrix": range(n),
            "col_base": range(max(self.cols) + lanes), "count": range(lanes + 1),
        })
        issued = Signal(flags)
        m.d.comb += [
            issued.valid.eq(issue),
            issued.first.eq(step == 0),
            issued.last.eq(final_step),
            issued.matrix.eq(current),
            issued.col_base.eq(col_base),
            issued.count.eq(Mux(final_group, tail_cols[current], lanes)),
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
        with m.If(moving):
            m.d.sync += staged.eq(read)
            m.d.sync += [bank.eq(port.data) for bank, port in zip(staged_weights, weight_reads)]
            for k, copies in enumerate(staged_copies):
                m.d.sync += [copy.eq(elements[k]) for copy in copies]

        # -- Operands, then multiply: one int8 × int8 product per lane and element, from a pair of
        # operand registers of its own, so that the long routes end in a register: a DSP block's
        # own input registers (see operand_product), or registers beside a multiplier made of
        # LUT logic, whose two partial products are added in the next stage with the others.
        operands = Signal(flags)
        multiplied = Signal(flags)
        with m.If(moving):
            m.d.sync += [operands.eq(staged), multiplied.eq(operands)]
        terms = [[] for _ in range(lanes)]  # per lane: what its products of the word add up from
        for k in range(ways):
            in_luts = k >= ways - self.lut_ways
            for lane in range(lanes):
                element = staged_copies[k][lane // self.REPLICA_LANES]
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
        out_free = Signal(init=1)  # out_count == 0
        finishing = multiplied.valid & multiplied.last
        next_valid = Mux(advance, operands.valid, multiplied.valid)
        next_last = Mux(advance, operands.last, multiplied.last)
        next_finishing = next_valid & next_last
        next_out_free = Mux(advance & finishing, 0, Mux(taking, out_count <= ways, out_free | taking_whole))
        next_advance = ~(next_finishing & ~next_out_free)
        # The lanes' enables, registered for the same reason.
        accumulate = Signal()  # advance & multiplied.valid & ~multiplied.last
        load = Signal()        # advance & finishing: the group's sums go to the output buffer
        load_whole = Signal()  # ... and it is a group of the `whole` matrix
        # multiplied.first: a group's first word starts the sum afresh. It selects in every
        # lane's adder: a copy per REPLICA_LANES lanes, each near its lanes.
        first = replicas(unsigned(1), -(-lanes // self.REPLICA_LANES), "lanes_first")
        m.d.sync += [
            out_free.eq(next_out_free),
            advance.eq(next_advance),
            accumulate.eq(next_advance & next_valid & ~next_last),
            load.eq(next_finishing & next_out_free),
            *(copy.eq(Mux(advance, operands.first, multiplied.first)) for copy in first),
        ]

        accumulating = global_net(m, platform, accumulate, "lanes_accumulate")
        loading = global_net(m, platform, load, "lanes_load")
        if self.whole is not None:
            next_matrix = Mux(advance, operands.matrix, multiplied.matrix)
            m.d.sync += load_whole.eq(next_finishing & next_out_free & (next_matrix == self.whole))
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
        return m
