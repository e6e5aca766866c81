from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out


__all__ = ["Residual"]


class Residual(wiring.Component):
    """The residual stream: stores a wide vector and adds it back later (docs/semantics.md, steps 1, 4, 6).

    Each input carries a rule index (``select``) and a column (``tag``). Per rule, the unit may
    add the column's entry of a stored vector to the value, and may store the result as the
    column's entry of a vector, before passing it on. The vectors live in LUT RAM, one word
    per column, written from the output register.

    The entry to add is looked up ahead of its value, wherever the value's column and rule are
    known first (in the epilogue: before the requant that makes the value), and arrives with
    the value as ``addend``: the add is then the stage's only logic.

    Parameters
    ----------
    in_bound : :class:`~int8model.bounds.Bound`
    vectors : dict of name → :class:`~int8model.bounds.Bound`
        The stored vectors and the range of their entries.
    rules : list of ``(add_from, store_to)``
        Vector names or ``None``, one pair per ``select`` value.
    out_bound : :class:`~int8model.bounds.Bound`
        The range of every output (the model's bounds prove it; the width follows from it).
    columns : int

    Ports
    -----
    lookup_tag, lookup_select : ``In(range(columns))``, ``In(range(len(rules)))``
    addend : ``Out(signed)``
        The stored entry that the rule ``lookup_select`` adds at column ``lookup_tag``, 0 where
        it adds none; no latency.
    i : ``In(stream.Signature(StructLayout({"value", "tag", "select", "addend"})))``
    o : ``Out(stream.Signature(StructLayout({"value", "tag", "select"})))``
        ``value + addend``.

    Latency 1 cycle, throughput one value per cycle.
    """

    def __init__(self, in_bound, vectors, rules, out_bound, columns):
        self.in_bound, self.vectors, self.rules = in_bound, dict(vectors), list(rules)
        self.out_bound, self.columns = out_bound, columns
        for add_from, store_to in self.rules:
            for name in (add_from, store_to):
                if name is not None and name not in self.vectors:
                    raise ValueError(f"no stored vector {name!r}")
        self.addend_bits = max(bound.bits for bound in self.vectors.values())
        tag, select = range(columns), range(len(self.rules))
        super().__init__({
            "lookup_tag": In(tag),
            "lookup_select": In(select),
            "addend": Out(signed(self.addend_bits)),
            "i": In(stream.Signature(data.StructLayout({
                "value": signed(in_bound.bits), "tag": tag, "select": select,
                "addend": signed(self.addend_bits)}))),
            "o": Out(stream.Signature(data.StructLayout({
                "value": signed(out_bound.bits), "tag": tag, "select": select}))),
        })

    def elaborate(self, platform):
        m = Module()
        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]

        # The stored vectors are small (a column each): LUT RAM, written from the output
        # register. A column is stored long before it is looked up (a whole matrix product
        # apart), so neither needs a bypass.
        reads, writes = {}, {}
        for name, bound in self.vectors.items():
            store = memory.Memory(shape=signed(bound.bits), depth=self.columns, init=[])
            m.submodules[name] = store
            reads[name] = store.read_port(domain="comb")
            writes[name] = store.write_port()
            m.d.comb += [
                reads[name].addr.eq(self.lookup_tag),
                writes[name].addr.eq(self.o.payload.tag),
                writes[name].data.eq(self.o.payload.value),
            ]
        with m.Switch(self.lookup_select):
            for index, (add_from, store_to) in enumerate(self.rules):
                if add_from is not None:
                    with m.Case(index):
                        m.d.comb += self.addend.eq(reads[add_from].data)
        # The output is stored (again, while it waits: the same value to the same column).
        with m.Switch(self.o.payload.select):
            for index, (add_from, store_to) in enumerate(self.rules):
                with m.Case(index):
                    if store_to is not None:
                        m.d.comb += writes[store_to].en.eq(self.o.valid)

        with m.If(advance):
            m.d.sync += [
                self.o.valid.eq(self.i.valid),
                self.o.payload.value.eq(self.i.payload.value + self.i.payload.addend),
                self.o.payload.tag.eq(self.i.payload.tag),
                self.o.payload.select.eq(self.i.payload.select),
            ]
        return m
