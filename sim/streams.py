"""cocotb drivers for ``amaranth.lib.stream`` ports, with random stalls on both sides."""

import random

from cocotb.triggers import ReadOnly, RisingEdge

from .payload import pack, unpack, width

__all__ = ["StreamSource", "StreamSink"]


class _StreamPort:
    """The three signals that a stream port flattens into, and the payload's layout."""

    def __init__(self, dut, name, layout, clock, rng):
        self.valid = getattr(dut, f"{name}__valid")
        self.ready = getattr(dut, f"{name}__ready")
        self.payload = getattr(dut, f"{name}__payload")
        self.layout, self.clock, self.rng = layout, clock, rng


class StreamSource(_StreamPort):
    """Drives ``<name>__valid`` and ``<name>__payload``; a payload moves when ``ready`` is high.

    ``idle`` is the probability of holding ``valid`` low on a cycle (a stalling producer).
    """

    def __init__(self, dut, name, layout, clock, *, idle=0.0, rng=None):
        super().__init__(dut, name, layout, clock, rng or random.Random(0))
        self.idle = idle
        self.valid.value = 0

    async def send(self, items):
        for item in items:
            while self.idle and self.rng.random() < self.idle:
                self.valid.value = 0
                await RisingEdge(self.clock)
            self.valid.value = 1
            if width(self.layout):
                self.payload.value = pack(self.layout, item)
            while True:
                await ReadOnly()
                taken = int(self.ready.value)
                await RisingEdge(self.clock)
                if taken:
                    break
        self.valid.value = 0


class StreamSink(_StreamPort):
    """Drives ``<name>__ready``, holding it low with probability ``stall`` each cycle."""

    def __init__(self, dut, name, layout, clock, *, stall=0.0, rng=None):
        super().__init__(dut, name, layout, clock, rng or random.Random(1))
        self.stall = stall
        self.ready.value = 0

    async def receive(self, count, *, timeout=100_000):
        items = []
        cycles = 0
        while len(items) < count:
            self.ready.value = int(not (self.stall and self.rng.random() < self.stall))
            await ReadOnly()
            if int(self.ready.value) and int(self.valid.value):
                word = int(self.payload.value) if width(self.layout) else 0
                items.append(unpack(self.layout, word))
            await RisingEdge(self.clock)
            cycles += 1
            if cycles > timeout:
                raise TimeoutError(f"{len(items)} of {count} items after {timeout} cycles")
        self.ready.value = 0
        return items
