from amaranth.hdl import Array, Cat, Module, Signal, signed, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from plan.loading import RULE_MULTIPLIER_BITS, RuleLayout

from .protocol import load_layout

__all__ = ["load_port", "connect_load", "ModelLoader", "RuleRegisters"]


def load_port(depth, width):
    """A word write into a memory of ``depth`` words of ``width`` bits, as the loader drives it."""
    return wiring.Signature({"addr": Out(range(max(2, depth))), "data": Out(width), "en": Out(1)})


def connect_load(m, memory, port):
    """A write port of ``memory`` taking ``port``'s writes (a unit's ``In(load_port(...))``)."""
    write = memory.write_port()
    m.d.comb += [write.addr.eq(port.addr), write.data.eq(port.data), write.en.eq(port.en)]


class ModelLoader(wiring.Component):
    """The bytes of a load (the protocol's ``load`` stream) into words, into the memories.

    A byte goes into its place in a word register (the address's low bits: a memory's word
    takes a power of two of bytes, :class:`plan.loading.LoadTarget`); the last byte of a word
    writes it, a cycle later, into its memory (its port's ``en`` for one cycle). The bytes of
    a word come in order, as the host sends an image; a byte for no memory writes nothing.

    Ports
    -----
    i : ``In(stream.Signature(load_layout()))``, always ready.
    <target name> : ``Out(load_port(depth, width))`` for each of ``targets``.
    """

    def __init__(self, targets):
        self.targets = tuple(targets)
        super().__init__({"i": In(stream.Signature(load_layout())),
                          **{target.name: Out(load_port(target.depth, target.width)) for target in self.targets}})

    def elaborate(self, platform):
        m = Module()
        widest = max(target.word_bytes for target in self.targets)
        word = Signal(8 * widest)
        write = Signal()
        write_memory = Signal.like(self.i.payload.memory)
        write_address = Signal(24)
        payload = self.i.payload
        m.d.comb += self.i.ready.eq(1)
        m.d.sync += write.eq(0)
        with m.If(self.i.valid):
            with m.Switch(payload.memory):
                for target in self.targets:
                    with m.Case(target.index):
                        low = (target.word_bytes - 1).bit_length()
                        place = payload.address[:low] if low else 0
                        with m.Switch(place):
                            for at in range(target.word_bytes):
                                with m.Case(at):
                                    m.d.sync += word.word_select(at, 8).eq(payload.data)
                        with m.If(place == target.word_bytes - 1):
                            m.d.sync += [write.eq(1), write_memory.eq(payload.memory),
                                         write_address.eq(payload.address >> low)]
        for target in self.targets:
            port = getattr(self, target.name)
            m.d.comb += [port.addr.eq(write_address), port.data.eq(word[:target.width]),
                         port.en.eq(write & (write_memory == target.index))]
        return m


class RuleRegisters(wiring.Component):
    """A loadable build's requant rules (:class:`plan.loading.RuleLayout`), in registers the
    load writes, read by the units: the epilogues' two requants by stage and attention's
    ``M_score`` by layer.

    Ports
    -----
    load : ``In(load_port(layout.count, RuleLayout.WIDTH))``
    """

    def __init__(self, layout, multiplier_bits):
        self.layout = layout
        self.multipliers = [Signal(signed(multiplier_bits), name=f"rule{i}_multiplier") for i in range(layout.count)]
        self.shifts = [Signal(unsigned(6), name=f"rule{i}_shift") for i in range(layout.count)]
        super().__init__({"load": In(load_port(layout.count, RuleLayout.WIDTH))})

    def first(self, select):
        """The first requant's ``(multiplier, shift)`` of stage ``select`` (a value)."""
        return self._pick([self.layout.first(s) for s in range(self.layout.selects)], select)

    def last(self, select):
        return self._pick([self.layout.last(s) for s in range(self.layout.selects)], select)

    def score(self, layer):
        return self._pick([self.layout.score(l) for l in range(self.layout.layers)], layer)

    def _pick(self, indices, which):
        if isinstance(which, int):
            return self.multipliers[indices[which]], self.shifts[indices[which]]
        return (Array(self.multipliers[i] for i in indices)[which], Array(self.shifts[i] for i in indices)[which])

    def elaborate(self, platform):
        m = Module()
        for index, (multiplier, shift) in enumerate(zip(self.multipliers, self.shifts)):
            with m.If(self.load.en & (self.load.addr == index)):
                m.d.sync += [multiplier.eq(self.load.data[:RULE_MULTIPLIER_BITS].as_signed()),
                             shift.eq(self.load.data[RULE_MULTIPLIER_BITS:])]
        return m
