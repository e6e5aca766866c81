from amaranth.hdl import Module, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["BootReplay", "connect_boot"]


class BootReplay(wiring.Component):
    """At power-up the protocol hears a boot image instead of the line: request frames in block
    RAM, the ``LOAD`` and ``COMMIT`` frames of a model (``hdl.build --from`` writes them into a
    loadable build's bitstream) or, as synthesised, bytes that hold no frame. A model so loaded
    passes the protocol's own checks, CRC-8 and CRC-32, before it runs.

    A byte is offered only where the protocol takes it (``listening``), so none is dropped.
    Until the image's last byte is taken and the protocol is idle, the line's bytes are dropped
    and the protocol's replies go nowhere; then the line and the protocol are joined.

    Parameters
    ----------
    image : bytes
        The block RAM's contents.

    Ports
    -----
    line_rx : ``In(stream.Signature(8))``, bytes from the UART.
    line_tx : ``Out(stream.Signature(8))``, bytes to the UART.
    rx : ``Out(stream.Signature(8))``, bytes to the protocol.
    tx : ``In(stream.Signature(8))``, the protocol's replies.
    listening, idle : ``In(1)``, the protocol's (:class:`hdl.protocol.CommandProtocol`).
    booting : ``Out(1)``, until the image has been replayed.
    """

    def __init__(self, image):
        self.image = bytes(image)
        super().__init__({
            "line_rx": In(stream.Signature(8)), "line_tx": Out(stream.Signature(8)),
            "rx": Out(stream.Signature(8)), "tx": In(stream.Signature(8)),
            "listening": In(1), "idle": In(1), "booting": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        depth = len(self.image)
        m.submodules.image = image = memory.Memory(shape=8, depth=depth, init=self.image,
                                                   attrs={"ram_style": "block"})
        read = image.read_port()
        address = Signal(range(depth))  # of the next byte to offer
        replayed = Signal()
        # A byte at most every third cycle, offered from a register when the protocol listened
        # the cycle before: it still listens (a listening state leaves only on a byte or a
        # timeout), and neither the block RAM's output nor the protocol's state is a path into
        # the other. A byte's read takes its address a cycle, its register another.
        byte = Signal(8)
        offer, offered, primed = Signal(), Signal(), Signal()
        m.d.comb += read.addr.eq(address)
        m.d.sync += [byte.eq(read.data), offered.eq(offer), primed.eq(1),
                     offer.eq(self.listening & primed & ~offer & ~offered & ~replayed)]
        with m.If(offer):
            m.d.sync += address.eq(address + 1)
            with m.If(address == depth - 1):
                m.d.sync += replayed.eq(1)
        with m.If(replayed & ~offer & self.idle):
            m.d.sync += self.booting.eq(0)

        with m.If(self.booting):
            m.d.comb += [self.rx.valid.eq(offer), self.rx.payload.eq(byte),
                         self.line_rx.ready.eq(1), self.tx.ready.eq(1)]
        with m.Else():
            m.d.comb += [self.rx.valid.eq(self.line_rx.valid), self.rx.payload.eq(self.line_rx.payload),
                         self.line_rx.ready.eq(self.rx.ready),
                         self.line_tx.valid.eq(self.tx.valid), self.line_tx.payload.eq(self.tx.payload),
                         self.tx.ready.eq(self.line_tx.ready)]
        return m


def connect_boot(m, boot, line_rx, line_tx, protocol):
    """Put ``boot`` between the line (``line_rx`` bytes from it, ``line_tx`` bytes to it) and
    ``protocol`` (a :class:`hdl.protocol.CommandProtocol`)."""
    m.submodules.boot = boot
    wiring.connect(m, line_rx, boot.line_rx)
    wiring.connect(m, boot.line_tx, line_tx)
    wiring.connect(m, boot.rx, protocol.rx)
    wiring.connect(m, protocol.tx, boot.tx)
    m.d.comb += [boot.listening.eq(protocol.listening), boot.idle.eq(protocol.idle)]
