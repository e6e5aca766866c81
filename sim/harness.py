"""Small compositions that give a unit under test what the engine would give it."""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.attention import Attention
from hdl.kv_cache import KVCache
from int8model.bounds import analyse
from plan.attention import attention_plan, exp_entries

__all__ = ["AttentionWithCache"]


class AttentionWithCache(wiring.Component):
    """The attention unit reading a KV cache whose write port, and row ``pos``'s readiness, the
    bench drives; both as a model's plan has them (``ways`` context columns and ``rows`` cache
    rows a cycle)."""

    def __init__(self, model, *, ways=1, rows=1):
        self.plan = attention_plan(model, analyse(model), ways=ways, rows=rows)
        self.attention = Attention(self.plan, exp_entries(self.plan, model.exp_lut))
        self.cache = KVCache(self.plan.cache)
        super().__init__({
            "write": In(self.cache.write.signature.flip()),
            "i": In(self.attention.i.signature.flip()),
            "keys_ready": In(1),
            "values_ready": In(1),
            "o": Out(self.attention.o.signature),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.attention = self.attention
        m.submodules.cache = self.cache
        wiring.connect(m, self.attention.cache, self.cache.read)
        m.d.comb += [
            self.attention.keys_ready.eq(self.keys_ready),
            self.attention.values_ready.eq(self.values_ready),
        ]
        wiring.connect(m, wiring.flipped(self.write), self.cache.write)
        wiring.connect(m, wiring.flipped(self.i), self.attention.i)
        wiring.connect(m, self.attention.o, wiring.flipped(self.o))
        return m
