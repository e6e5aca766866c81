"""The context's last stages, from each word's numerators and dens to its words of ``ci``:
row pos's products added on the way where V[pos] comes after the query
(:func:`own_row_added`), then the dividers (:class:`ContextDividers`)."""

from amaranth.hdl import Array, Cat, Const, Module, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .divider import FloorDivider
from .fifo import StreamFIFO
from .loader import connect_load, load_port
from .product import operand_product

__all__ = ["context_layout", "word_layout", "ContextDividers", "shifted_dens", "own_row_added", "OWN_ROW_LATENCY",
           "OWN_ROW_LEAD"]

# Row pos's products added: a word's operands (its heads' w_pos, its columns of V[pos]) → their
# products → the sums with the numerators. These are read in the last stage: the context
# starts OWN_ROW_LEAD cycles before they are complete.
OWN_ROW_LATENCY = 3
OWN_ROW_LEAD = OWN_ROW_LATENCY - 1


def word_layout(plan):
    """What a word of the context carries beside its values: how many of its ``ways`` columns
    are the vector's, whether it is the last, and (deep models) its layer."""
    return data.StructLayout({"count": range(plan.ways + 1), "last": 1,
                              **({} if plan.layers == 1 else {"layer": range(plan.layers)})})


def context_layout(plan):
    """A word of ``ci``: ``ways`` columns (at most int8 wide) and its :func:`word_layout`."""
    return data.StructLayout({"values": data.ArrayLayout(signed(plan.ctx_bits), plan.ways),
                              **{name: field.shape for name, field in word_layout(plan)}})


class ContextDividers(wiring.Component):
    """``ways`` floor dividers side by side (:class:`~.divider.FloorDivider`), each column's
    ``fdiv(num, den)`` with r_ctx applied in their last stage (a table of its results), or, in
    a loadable build, by a table of r_ctx's results after them (each layer's 256, the load's);
    then a queue of a whole context's words.

    They never stall: ``i`` is always ready, and its producer starts a context only when the
    queue has room for all of it (:attr:`words`).

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"num", "den", "tag"})))``
        A word's ``ways`` numerators and dens, and its :func:`word_layout`.
    o : ``Out(stream.Signature(context_layout(plan)))``
    load_ctx : a loadable build's r_ctx tables (:func:`~.loader.load_port`).
    """

    def __init__(self, plan):
        self.plan = plan
        self.words = -(-plan.d_model // plan.ways)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "num": data.ArrayLayout(signed(plan.num_bound.bits), plan.ways),
                "den": data.ArrayLayout(signed(plan.den_bound.bits), plan.ways),
                "tag": word_layout(plan)}))),
            "o": Out(stream.Signature(context_layout(plan))),
            **({"load_ctx": In(load_port(plan.ctx_table_depth, 8))} if plan.loaded else {}),
        })

    def elaborate(self, platform):
        m = Module()
        plan, ways, layers = self.plan, self.plan.ways, self.plan.layers
        word = word_layout(plan)
        m.submodules.queue = queue = StreamFIFO(self.o.payload.shape(), self.words, fall_through=True)
        wiring.connect(m, queue.o, wiring.flipped(self.o))
        m.d.comb += self.i.ready.eq(1)
        if plan.loaded:
            # The dividers' words a cycle later, through each column's copy of the table.
            delayed_word = Signal(word)
            delayed_valid = Signal()
            m.d.comb += [queue.i.valid.eq(delayed_valid),
                         *(getattr(queue.i.payload, name).eq(getattr(delayed_word, name)) for name, _ in word)]
        for k in range(ways):
            divider = FloorDivider(plan.divider, tag_shape=word if k == 0 else unsigned(0))
            m.submodules[f"divider{k}"] = divider
            out = divider.o
            m.d.comb += [
                divider.i.valid.eq(self.i.valid),
                *([divider.i.payload.layer.eq(self.i.payload.tag.layer)] if divider.layers > 1 else []),
                divider.i.payload.num.eq(self.i.payload.num[k]),
                divider.i.payload.den.eq(self.i.payload.den[k]),
                out.ready.eq(1),
            ]
            if k == 0:
                m.d.comb += divider.i.payload.tag.eq(self.i.payload.tag)
                word_out = out  # the first divider's tag: the word's layer (the next query's may differ)
            if plan.loaded:
                m.submodules[f"ctx_table{k}"] = table = memory.Memory(
                    shape=8, depth=plan.ctx_table_depth, init=[], attrs={"ram_style": "block"})
                connect_load(m, table, self.load_ctx)
                read = table.read_port()
                m.d.comb += [read.addr.eq(Cat(out.payload.value[:8], word_out.payload.tag.layer) if layers > 1
                                          else out.payload.value[:8]),
                             queue.i.payload.values[k].eq(read.data.as_signed())]
                if k == 0:
                    m.d.sync += [delayed_valid.eq(out.valid), delayed_word.eq(out.payload.tag)]
                continue
            m.d.comb += queue.i.payload.values[k].eq(out.payload.value)
            if k == 0:
                m.d.comb += [queue.i.valid.eq(out.valid),
                             *(getattr(queue.i.payload, name).eq(getattr(out.payload.tag, name)) for name, _ in word)]
        return m


def shifted_dens(m, plan, den, shifting):
    """Where V[pos] comes with the query, the dens the dividers take, as the numerators' head
    does: each column's, its head's, copied into a register of its own until the context
    starts, shifted down with the numerators on ``shifting`` (each column's copy of the
    enable). The dividers take them from registers, with no select between them (a select of
    each word's heads' dens, by column or by word, would sit on the route to the dividers)."""
    d, ways, hd = plan.d_model, plan.ways, plan.head_dim
    column_dens = [Signal(signed(plan.den_bound.bits), name=f"column_den{e}") for e in range(d)]
    for e in range(d):
        with m.If(shifting[e]):
            if e < d - ways:
                m.d.sync += column_dens[e].eq(column_dens[e + ways])
        with m.Else():
            # Copied on every cycle until the context starts, so also from the final den: the
            # enable is the shift's register, not the state's decode.
            m.d.sync += column_dens[e].eq(den[e // hd])
    return [column_dens[min(k, d - 1)] for k in range(ways)]


def own_row_added(m, platform, plan, taken, tag, num, den, own_weight, values, word_index):
    """Where V[pos] comes after the query (``plan.late_values``), each word's ``w_pos ·
    V[pos][e]`` added to its numerators on the way to the dividers, in ``OWN_ROW_LATENCY``
    stages from the cycle a word is taken (``taken``, its index ``word_index``): its operands
    (its heads' ``w_pos`` in ``own_weight``, its columns of ``values``) into a multiplier's own
    registers, the products, then the sums with the numerators at the head of ``num``, which
    the word reaches ``OWN_ROW_LEAD`` cycles after it is taken. Returns what the dividers take (valid,
    tag, numerators, dens) and the numerators' shift enable a cycle ahead."""
    d, ways, hd = plan.d_model, plan.ways, plan.head_dim
    columns_of_word = [[w * ways + k for w in range(-(-d // ways))] for k in range(ways)]
    latency, lead = OWN_ROW_LATENCY, OWN_ROW_LEAD

    def later(value, shape, name, count):  # `value`, `count` cycles later
        for i in range(count):
            register = Signal(shape, name=f"{name}{i}")
            m.d.sync += register.eq(value)
            value = register
        return value
    valid = later(taken, 1, "context_valid", latency)
    tag = later(tag, tag.shape(), "context_tag", latency)
    at_head = later(word_index, word_index.shape(), "context_word", lead)  # the word whose numerators are at the head
    sums, dens = [], []
    for k, columns in enumerate(columns_of_word):
        weight = Array(own_weight[e // hd] if e < d else Const(0) for e in columns)[word_index]
        value = Array(values[e] if e < d else Const(0, signed(8)) for e in columns)[word_index]
        product = operand_product(m, platform, weight, value, name=f"own_product{k}")
        own = later(product, product.shape(), f"own_product{k}_", latency - 2)
        summed = Signal(signed(plan.num_bound.bits), name=f"context_num{k}")
        m.d.sync += summed.eq((num[k] if k < d else 0) + own)
        sums.append(summed)
        head_den = Signal(signed(plan.den_bound.bits), name=f"context_den{k}")
        m.d.sync += head_den.eq(Array(den[min(e, d - 1) // hd] for e in columns)[at_head])
        dens.append(head_den)
    return valid, tag, sums, dens, later(taken, 1, "context_shift_ahead", lead - 1)
