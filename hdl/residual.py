from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out


__all__ = ["Residual"]


class Residual(wiring.Component):
    """The residual stream: stores a wide vector and adds it back later (docs/semantics.md, steps 1, 4, 6).

    Each input carries a rule index (``select``) and a column (``tag``). Per rule, the unit may
    add the column's entry of a stored vector to the value, and may store the result as the
    column's entry of a vector, before passing it on. The vectors live in LUT RAM, one word
    per column, read as the input arrives and written from the output register.

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
    i, o : ``stream.Signature(StructLayout({"value", "tag", "select"}))``

    Latency 1 cycle, throughput one value per cycle.
    """

    def __init__(self, in_bound, vectors, rules, out_bound, columns):
        self.in_bound, self.vectors, self.rules = in_bound, dict(vectors), list(rules)
        self.out_bound, self.columns = out_bound, columns
        for add_from, store_to in self.rules:
            for name in (add_from, store_to):
                if name is not None and name not in self.vectors:
                    raise ValueError(f"no stored vector {name!r}")
        tag, select = range(columns), range(len(self.rules))
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "value": signed(in_bound.bits), "tag": tag, "select": select}))),
            "o": Out(stream.Signature(data.StructLayout({
                "value": signed(out_bound.bits), "tag": tag, "select": select}))),
        })

    def elaborate(self, platform):
        m = Module()
        advance = Signal()
        m.d.comb += [advance.eq(~self.o.valid | self.o.ready), self.i.ready.eq(advance)]

        # The stored vectors are small (a column each): LUT RAM, read as the input arrives,
        # written from the output register a cycle later. A column is stored long before it
        # is read back (a whole matrix product apart), so neither needs a bypass.
        reads, writes = {}, {}
        for name, bound in self.vectors.items():
            store = memory.Memory(shape=signed(bound.bits), depth=self.columns, init=[])
            m.submodules[name] = store
            reads[name] = store.read_port(domain="comb")
            writes[name] = store.write_port()
            m.d.comb += [
                reads[name].addr.eq(self.i.payload.tag),
                writes[name].addr.eq(self.o.payload.tag),
                writes[name].data.eq(self.o.payload.value),
            ]

        # One stage: add and pass on; the output is stored (again, while it waits: the same
        # value to the same column).
        value = self.i.payload.value
        result = Signal(signed(self.out_bound.bits))
        m.d.comb += result.eq(value)
        with m.Switch(self.i.payload.select):
            for index, (add_from, store_to) in enumerate(self.rules):
                with m.Case(index):
                    if add_from is not None:
                        m.d.comb += result.eq(value + reads[add_from].data)
        with m.Switch(self.o.payload.select):
            for index, (add_from, store_to) in enumerate(self.rules):
                with m.Case(index):
                    if store_to is not None:
                        m.d.comb += writes[store_to].en.eq(self.o.valid)

        with m.If(advance):
            m.d.sync += [
                self.o.valid.eq(self.i.valid),
                self.o.payload.value.eq(result),
                self.o.payload.tag.eq(self.i.payload.tag),
                self.o.payload.select.eq(self.i.payload.select),
            ]
        return m
