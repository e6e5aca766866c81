from amaranth.hdl import Module, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["CacheRead", "KVCache"]


class CacheRead(wiring.Signature):
    """A read of one cache position: ``row`` in, both rows out one cycle later (seen from the reader)."""

    def __init__(self, d_model, seq_len):
        row = data.ArrayLayout(signed(8), d_model)
        super().__init__({"row": Out(range(seq_len)), "k": In(row), "v": In(row)})


class KVCache(wiring.Component):
    """The attention's key and value cache: ``seq_len`` rows of ``d_model`` int8 each, in block RAM.

    A row is written whole, K and V together, at its position; the attention unit reads rows
    0..pos. Positions past ``pos`` are never read, so rows of an earlier sequence are never seen
    and nothing needs clearing between sequences.

    Ports
    -----
    write : ``In(stream.Signature(StructLayout({"pos", "k", "v"})))``
        Always ready: a row is written the cycle it is offered.
    read : ``In(CacheRead(d_model, seq_len))``
        One cycle of latency.
    """

    def __init__(self, d_model, seq_len):
        self.d_model, self.seq_len = d_model, seq_len
        row = data.ArrayLayout(signed(8), d_model)
        super().__init__({
            "write": In(stream.Signature(data.StructLayout({"pos": range(seq_len), "k": row, "v": row}))),
            "read": In(CacheRead(d_model, seq_len)),
        })

    @property
    def bits(self):
        return 2 * self.seq_len * self.d_model * 8

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.write.ready.eq(1)
        for name in ("k", "v"):
            # Block RAM even where the rows are few: in distributed RAM, the read address
            # would fan out to every bit of the cache.
            store = memory.Memory(shape=unsigned(8 * self.d_model), depth=self.seq_len, init=[],
                                  attrs={"ram_style": "block"})
            m.submodules[name] = store
            writer = store.write_port()
            reader = store.read_port()  # one cycle of latency
            m.d.comb += [
                writer.addr.eq(self.write.payload.pos),
                writer.data.eq(getattr(self.write.payload, name)),
                writer.en.eq(self.write.valid),
                reader.addr.eq(self.read.row),
                getattr(self.read, name).eq(reader.data),
            ]
        return m
