import numpy as np
from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from int8model.bounds import Bound, matvec_bound

from .fifo import SkidBuffer

__all__ = ["MatVec"]

INT8 = Bound(-128, 127)


class MatVec(wiring.Component):
    """Matrix-vector products ``y[j] = Σ_e x[e] · W[e, j]`` over int8 matrices held in block RAM.

    ``lanes`` multipliers work in parallel, each on one output column: a matrix with ``cols``
    columns is computed in ``ceil(cols / lanes)`` groups, each taking ``rows`` cycles, the input
    vector streamed in during the first group and replayed from a buffer for the others. Each
    lane reads its weights from one word of a shared memory that holds every matrix, row by
    row, group after group, so the same lanes serve all the model's matrices in turn.

    With ``banks`` > 1 there are ``banks`` sets of ``lanes`` lanes, each with its own output.
    A matrix listed in ``banked`` is split into ``banks`` equal blocks of columns, block k
    computed on bank k at the same time as the others (q, k and v from one pass over x); every
    other matrix runs on bank 0 alone.

    Parameters
    ----------
    matrices : list of 2-D integer arrays (rows × cols, input-major), values in int8
    lanes : int
    input_bounds : list of :class:`~int8model.bounds.Bound`, one per matrix
        The range of that matrix's input elements (int8 by default); with the weights it
        bounds the accumulator, whose width is derived from it.
    banks : int
    banked : indices of the matrices split over the banks

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"value": signed(8), "matrix": range(n)})))``
        A vector's ``rows`` elements in order, ``matrix`` the same on each.
    o : ``Out(stream.Signature(StructLayout({"acc", "column", "matrix", "last"})))``
        Bank 0's accumulators, one per cycle, in column order; ``last`` marks the last column
        the bank computes for the vector.
    o1, o2, … : the same for banks 1, 2, …; ``column`` counts the matrix's columns, not the block's.

    Latency: the first output leaves 5 cycles after the last input of the first group.
    Throughput: one input element per cycle per group, one output per cycle; with
    ``lanes <= rows`` the output never stalls the lanes.
    """

    def __init__(self, matrices, lanes, *, input_bounds=None, banks=1, banked=()):
        self.matrices = [np.asarray(w, dtype=np.int64) for w in matrices]
        if not self.matrices:
            raise ValueError("MatVec needs at least one matrix")
        for w in self.matrices:
            if w.ndim != 2 or w.size == 0 or w.min() < -128 or w.max() > 127:
                raise ValueError("every matrix is a non-empty 2-D int8 array")
        if lanes < 1:
            raise ValueError(f"{lanes} lanes")
        self.lanes, self.banks, self.banked = lanes, banks, tuple(banked)
        self.rows = [w.shape[0] for w in self.matrices]
        self.cols = [w.shape[1] for w in self.matrices]
        for index in self.banked:
            if self.cols[index] % banks:
                raise ValueError(f"matrix {index}'s {self.cols[index]} columns do not split into {banks} banks")
        # The columns each bank computes of each matrix (0: the bank is idle for it).
        self.block_cols = [c // banks if index in self.banked else c for index, c in enumerate(self.cols)]
        self.groups = [-(-c // lanes) for c in self.block_cols]
        self.bases = np.cumsum([0] + [r * g for r, g in zip(self.rows, self.groups)]).tolist()
        self.depth = self.bases[-1]
        input_bounds = input_bounds or [INT8] * len(self.matrices)
        self.acc_bound = Bound(
            min(matvec_bound(b, w).lo for b, w in zip(input_bounds, self.matrices)),
            max(matvec_bound(b, w).hi for b, w in zip(input_bounds, self.matrices)))
        self.acc_bits = self.acc_bound.bits
        n = len(self.matrices)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "value": signed(8),
                "matrix": range(n),
            }))),
            **{("o" if bank == 0 else f"o{bank}"): Out(stream.Signature(data.StructLayout({
                "acc": signed(self.acc_bits),
                "column": range(max(self.cols)),
                "matrix": range(n),
                "last": 1,
            }))) for bank in range(banks)},
        })
        self.outputs = [self.o] + [getattr(self, f"o{bank}") for bank in range(1, banks)]

    def weight_words(self):
        """The weight memory's contents: one word per (matrix, group, row); bank k's lane l in
        byte ``k · lanes + l``."""
        words = []
        for index, (w, groups, block) in enumerate(zip(self.matrices, self.groups, self.block_cols)):
            banks = self.banks if index in self.banked else 1
            for g in range(groups):
                for e in range(w.shape[0]):
                    word = 0
                    for bank in range(banks):
                        for lane in range(self.lanes):
                            j = g * self.lanes + lane
                            if j < block:
                                byte = (int(w[e, bank * block + j]) & 0xff)
                                word |= byte << (8 * (bank * self.lanes + lane))
                    words.append(word)
        return words

    @property
    def multipliers(self):
        return self.lanes * self.banks

    def elaborate(self, platform):
        m = Module()
        lanes = self.lanes
        n = len(self.matrices)

        m.submodules.weights = weights = memory.Memory(
            shape=unsigned(8 * lanes * self.banks), depth=self.depth, init=self.weight_words())
        # Both read ports have one cycle of latency; both pause with the pipeline.
        weight_read = weights.read_port()
        m.submodules.vector = vector = memory.Memory(shape=signed(8), depth=max(self.rows), init=[])
        vector_write = vector.write_port()
        vector_read = vector.read_port()

        def table(values, shape):
            return Array(Const(v, shape) for v in values)

        last_row = table([r - 1 for r in self.rows], range(max(self.rows)))
        last_group = table([g - 1 for g in self.groups], range(max(self.groups)))
        base = table(self.bases[:n], range(self.depth + 1))
        tail_cols = table([c - (g - 1) * lanes for c, g in zip(self.block_cols, self.groups)], range(lanes + 1))

        advance = Signal(init=1)  # the whole pipeline moves (a register: see the output)
        m.d.comb += [weight_read.en.eq(advance), vector_read.en.eq(advance)]

        # -- Issue: one row per cycle, from the input stream (group 0) or the buffer (replay).
        replay = Signal()
        row = Signal(range(max(self.rows)))
        group = Signal(range(max(self.groups)))
        matrix = Signal(range(n))
        address = Signal(range(self.depth + 1))
        col_base = Signal(range(max(self.cols) + lanes))

        starting = ~replay & (row == 0) & (group == 0)
        current = Signal(range(n))
        m.d.comb += current.eq(Mux(starting, self.i.payload.matrix, matrix))
        m.d.comb += self.i.ready.eq(advance & ~replay)
        issue = Signal()
        m.d.comb += issue.eq(Mux(replay, advance, self.i.valid & self.i.ready))

        m.d.comb += [
            weight_read.addr.eq(Mux(starting, base[current], address)),
            vector_read.addr.eq(row),
            vector_write.addr.eq(row),
            vector_write.data.eq(self.i.payload.value),
            vector_write.en.eq(self.i.valid & self.i.ready),
        ]
        final_row = row == last_row[current]
        final_group = group == last_group[current]
        with m.If(issue):
            m.d.sync += [matrix.eq(current), address.eq(weight_read.addr + 1)]
            with m.If(final_row):
                m.d.sync += row.eq(0)
                with m.If(final_group):
                    m.d.sync += [group.eq(0), replay.eq(0), col_base.eq(0)]
                with m.Else():
                    m.d.sync += [group.eq(group + 1), replay.eq(1), col_base.eq(col_base + lanes)]
            with m.Else():
                m.d.sync += row.eq(row + 1)

        # Stage flags that travel with each row down the pipeline.
        flags = data.StructLayout({
            "valid": 1, "first": 1, "last": 1, "matrix": range(n),
            "col_base": range(max(self.cols) + lanes), "count": range(lanes + 1),
        })
        issued = Signal(flags)
        m.d.comb += [
            issued.valid.eq(issue),
            issued.first.eq(row == 0),
            issued.last.eq(final_row),
            issued.matrix.eq(current),
            issued.col_base.eq(col_base),
            issued.count.eq(Mux(final_group, tail_cols[current], lanes)),
        ]

        # -- Read: the weight word and the input element arrive.
        read = Signal(flags)
        direct = Signal(signed(8))
        from_input = Signal()
        with m.If(advance):
            m.d.sync += [read.eq(issued), direct.eq(self.i.payload.value), from_input.eq(~replay)]
        element = Signal(signed(8))
        m.d.comb += element.eq(Mux(from_input, direct, vector_read.data))

        # -- Operands: the block RAM's output goes straight into a register, not a multiplier.
        staged = Signal(flags)
        # The element goes to every lane's multiplier: two copies halve that fanout. Their
        # reset values differ in every bit, or synthesis would merge them back into one.
        staged_copies = [Signal(signed(8), init=init, name=f"staged_element{index}")
                         for index, init in enumerate((0, -1))]
        staged_weights = Signal(unsigned(8 * lanes * self.banks))
        with m.If(advance):
            m.d.sync += [staged.eq(read), staged_weights.eq(weight_read.data)]
            m.d.sync += [copy.eq(element) for copy in staged_copies]

        # -- Multiply: one int8 × int8 product per lane.
        all_lanes = lanes * self.banks
        multiplied = Signal(flags)
        products = [Signal(signed(16), name=f"product{lane}") for lane in range(all_lanes)]
        with m.If(advance):
            m.d.sync += multiplied.eq(staged)
            for lane, product in enumerate(products):
                weight = staged_weights[8 * lane:8 * lane + 8].as_signed()
                m.d.sync += product.eq(staged_copies[2 * lane // all_lanes] * weight)

        # -- Accumulate; a group's last row lands in the output buffers instead.
        accumulators = [Signal(signed(self.acc_bits), name=f"acc{lane}") for lane in range(all_lanes)]
        outputs = [Signal(signed(self.acc_bits), name=f"out{lane}") for lane in range(all_lanes)]

        # The lanes stall while a finished group waits for an output buffer. `advance` fans
        # out to every lane's registers, so it is a register itself, computed a cycle ahead
        # from the next cycle's state (and not from a consumer's readiness: in the engine
        # that depends on the lanes', since outputs feed the next input).
        finishing = multiplied.valid & multiplied.last
        loading = advance & finishing
        next_valid = Mux(advance, staged.valid, multiplied.valid)
        next_last = Mux(advance, staged.last, multiplied.last)
        next_finishing = next_valid & next_last
        next_frees = []
        # The lanes' two enables, registered for the same reason.
        accumulate = Signal()  # advance & multiplied.valid & ~multiplied.last
        load = Signal()        # advance & finishing: the group's sums go to the output buffers

        for bank, port in enumerate(self.outputs):
            block = [self.block_cols[index] if index in self.banked or bank == 0 else 0 for index in range(n)]
            in_bank = table([int(c > 0) for c in block], 1)
            offset = table([bank * c for c in block], range(max(self.cols) + 1))
            last_col = table([(bank + 1) * c - 1 if c else 0 for c in block], range(max(self.cols)))
            count = Signal(range(lanes + 1), name=f"count{bank}")
            column = Signal(range(max(self.cols) + lanes), name=f"column{bank}")
            matrix_out = Signal(range(n), name=f"matrix{bank}")
            free = Signal(init=1, name=f"free{bank}")  # count == 0
            buffer = outputs[bank * lanes:(bank + 1) * lanes]

            # Each output leaves through a register slice: the consumer's readiness would
            # otherwise reach every lane's output register through the shift below.
            m.submodules[f"slice{bank}"] = output = SkidBuffer(port.payload.shape())
            wiring.connect(m, output.o, wiring.flipped(port))
            taking = output.i.valid & output.i.ready
            loaded = Mux(in_bank[multiplied.matrix], multiplied.count, 0)
            next_free = Mux(loading, loaded == 0, Mux(taking, count == 1, free))
            next_frees.append(next_free)
            m.d.sync += free.eq(next_free)
            m.d.comb += [
                output.i.valid.eq(~free),
                output.i.payload.acc.eq(buffer[0]),
                output.i.payload.column.eq(column),
                output.i.payload.matrix.eq(matrix_out),
                output.i.payload.last.eq(column == last_col[matrix_out]),
            ]
            with m.If(load):
                m.d.sync += [
                    count.eq(loaded),
                    column.eq(multiplied.col_base + offset[multiplied.matrix]),
                    matrix_out.eq(multiplied.matrix),
                ]
            with m.Elif(taking):
                # Shift the buffer down: the next column's sum moves to the output.
                m.d.sync += [count.eq(count - 1), column.eq(column + 1)]
                for here, after in zip(buffer, buffer[1:]):
                    m.d.sync += here.eq(after)

        next_out_free = Signal()
        m.d.comb += next_out_free.eq(Cat(*next_frees).all())
        next_advance = ~(next_finishing & ~next_out_free)
        m.d.sync += [
            advance.eq(next_advance),
            accumulate.eq(next_advance & next_valid & ~next_last),
            load.eq(next_finishing & next_out_free),
        ]
        for acc, out, product in zip(accumulators, outputs, products):
            total = Mux(multiplied.first, product, acc + product)
            with m.If(accumulate):
                m.d.sync += acc.eq(total)
            with m.If(load):
                m.d.sync += out.eq(total)
        return m
