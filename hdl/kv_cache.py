from amaranth.hdl import Cat, Module, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["CacheRead", "KVCache"]


def check_banks(banks):
    if banks < 1 or banks & (banks - 1):
        raise ValueError(f"{banks} banks: the cache takes a power of two")


class CacheRead(wiring.Signature):
    """A read of one group of ``banks`` consecutive cache positions: ``group`` (and, for a deep
    model, ``layer``) in, the rows ``group · banks + b`` out, bank by bank,
    :attr:`KVCache.LATENCY` cycles later (seen from the reader), for a
    :class:`plan.units.CachePlan`."""

    def __init__(self, plan):
        check_banks(plan.banks)
        rows = data.ArrayLayout(data.ArrayLayout(signed(8), plan.d_model), plan.banks)
        layer = {} if plan.layers == 1 else {"layer": Out(range(plan.layers))}
        super().__init__({"group": Out(range(plan.groups)), **layer, "k": In(rows), "v": In(rows)})


class KVCache(wiring.Component):
    """The attention's key and value cache: ``seq_len`` rows of ``d_model`` int8 each, in block RAM.

    A row is written whole, K and V together, at its position (and, for a deep model, its
    layer's rows); the attention unit reads rows 0..pos. Positions past ``pos`` are never read, so rows of an earlier sequence are never seen
    and nothing needs clearing between sequences.

    The rows are spread over ``banks`` memories (position ``p`` in bank ``p mod banks``), so
    that a read returns ``banks`` consecutive rows at once.

    Ports
    -----
    write : ``In(stream.Signature(StructLayout({"pos", "k", "v"})))``, and ``layer`` for a deep model
        Always ready: a row is written the cycle it is offered.
    read : ``In(CacheRead(plan))``
        Two cycles of latency: the block RAMs' rows go through registers of their own, with
        nothing before them, so that their slow output (over 5 ns on the ECP5) is not followed
        by the route to wherever the rows are used.
    """

    LATENCY = 2

    def __init__(self, plan):
        check_banks(plan.banks)
        self.plan = plan
        self.d_model, self.seq_len, self.banks = plan.d_model, plan.seq_len, plan.banks
        row = data.ArrayLayout(signed(8), plan.d_model)
        layer = {} if plan.layers == 1 else {"layer": range(plan.layers)}
        super().__init__({
            "write": In(stream.Signature(data.StructLayout({"pos": range(plan.seq_len), **layer, "k": row, "v": row}))),
            "read": In(CacheRead(plan)),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.write.ready.eq(1)
        bank_bits = self.banks.bit_length() - 1
        pos = self.write.payload.pos
        if self.plan.layers == 1:
            write_address, read_address = pos >> bank_bits, self.read.group
        else:  # a layer's rows a power of two apart: its bits above the group's
            group_bits = self.plan.group_bits
            write_address = Cat((pos >> bank_bits)[:group_bits], self.write.payload.layer)
            read_address = Cat(self.read.group[:group_bits], self.read.layer)
        for bank in range(self.banks):
            for name in ("k", "v"):
                # Block RAM even where the rows are few: in distributed RAM, the read address
                # would fan out to every bit of the cache.
                store = memory.Memory(shape=unsigned(self.plan.row_bits), depth=self.plan.depth,
                                      init=[], attrs={"ram_style": "block"})
                m.submodules[f"{name}{bank}"] = store
                writer = store.write_port()
                reader = store.read_port()  # one cycle of latency, then the register
                m.d.comb += [
                    writer.addr.eq(write_address),
                    writer.data.eq(getattr(self.write.payload, name)),
                    writer.en.eq(self.write.valid & (pos[:bank_bits] == bank if bank_bits else 1)),
                    reader.addr.eq(read_address),
                ]
                m.d.sync += getattr(self.read, name)[bank].eq(reader.data)
        return m
