from amaranth.hdl import Module, Signal, signed
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out


__all__ = ["Residual"]


class Residual(wiring.Component):
    """The residual stream: stores wide vectors, and looks their entries up to be added later (docs/semantics.md, steps 1, 4, 6).

    Per rule (``select``), a value may be stored as a column's entry of a vector, and a value
    may add the column's entry of a vector. The adding itself is the requant's that makes the
    value (:class:`~.requant.Requant`'s ``addend``): the entry is looked up ahead of its value,
    where the value's column and rule are known first, and travels with it. The vectors live
    in LUT RAM, one word per column.

    Parameters
    ----------
    plan : :class:`plan.units.ResidualPlan`
        The stored vectors and the range of their entries; per ``select`` value, the vector it
        adds from and the one it stores to (or ``None``); the columns; the stored values' width.

    Ports
    -----
    lookup_tag, lookup_select : ``In(range(columns))``, ``In(range(len(rules)))``
    addend : ``Out(signed)``
        The stored entry that the rule ``lookup_select`` adds at column ``lookup_tag``, 0 where
        it adds none; no latency.
    store_tag, store_select, store_value, store_valid : ``In``
        A value of rule ``store_select`` at column ``store_tag``: stored, where the rule stores,
        a cycle after a cycle with ``store_valid``.
    """

    def __init__(self, plan):
        self.plan = plan
        self.vectors, self.rules, self.columns = dict(plan.vectors), list(plan.rules), plan.columns
        for add_from, store_to in self.rules:
            for name in (add_from, store_to):
                if name is not None and name not in self.vectors:
                    raise ValueError(f"no stored vector {name!r}")
        tag, select = range(self.columns), range(len(self.rules))
        super().__init__({
            "lookup_tag": In(tag),
            "lookup_select": In(select),
            "addend": Out(signed(plan.addend_bits)),
            "store_tag": In(tag),
            "store_select": In(select),
            "store_value": In(signed(plan.value_bits)),
            "store_valid": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        # A column is stored long before it is looked up (a whole matrix product apart), so
        # neither needs a bypass, and the write may wait a cycle: it is made from registers,
        # each vector's enable decoded ahead, not from the handshake of the value it stores
        # (a requant's output, its stage decoded, and a route to the LUT RAM's write enable,
        # all in one cycle).
        store_tag = Signal.like(self.store_tag)
        store_value = Signal.like(self.store_value)
        m.d.sync += [store_tag.eq(self.store_tag), store_value.eq(self.store_value)]
        reads, writes = {}, {}
        for name, bound in self.vectors.items():
            store = memory.Memory(shape=signed(bound.bits), depth=self.columns, init=[],
                                  attrs={"ram_style": "distributed"})
            m.submodules[name] = store
            reads[name] = store.read_port(domain="comb")
            writes[name] = store.write_port()
            stores_here = [index for index, (_, store_to) in enumerate(self.rules) if store_to == name]
            m.d.sync += writes[name].en.eq(self.store_valid & self.store_select.matches(*stores_here))
            m.d.comb += [
                reads[name].addr.eq(self.lookup_tag),
                writes[name].addr.eq(store_tag),
                writes[name].data.eq(store_value),
            ]
        with m.Switch(self.lookup_select):
            for index, (add_from, store_to) in enumerate(self.rules):
                if add_from is not None:
                    with m.Case(index):
                        m.d.comb += self.addend.eq(reads[add_from].data)
        return m
