from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["UARTReceiver", "UARTTransmitter", "UART", "divisor_for"]


def divisor_for(clock_hz, baud):
    """Clock cycles per bit, and the baud rate error it leaves (a fraction)."""
    divisor = round(clock_hz / baud)
    if divisor < 4:
        raise ValueError(f"a {clock_hz} Hz clock is too slow for {baud} baud (needs 4 cycles a bit)")
    return divisor, abs(clock_hz / divisor - baud) / baud


class UARTTransmitter(wiring.Component):
    """8N1 transmitter: a start bit, eight data bits least significant first, a stop bit.

    Ports
    -----
    i : ``In(stream.Signature(8))``
        Bytes to send; one is taken when the line is idle.
    tx : ``Out(1)``, idle high.
    """

    i: In(stream.Signature(8))
    tx: Out(1, init=1)

    def __init__(self, divisor):
        self.divisor = divisor
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        frame = Signal(10)   # stop, data[7:0], start; shifted out from the bottom
        bits = Signal(range(11))
        timer = Signal(range(self.divisor))
        m.d.comb += self.i.ready.eq(bits == 0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [frame.eq((1 << 9) | (self.i.payload << 1)), bits.eq(10), timer.eq(0)]
        with m.Elif(bits != 0):
            m.d.sync += self.tx.eq(frame[0])
            with m.If(timer == self.divisor - 1):
                m.d.sync += [timer.eq(0), frame.eq(frame >> 1), bits.eq(bits - 1)]
            with m.Else():
                m.d.sync += timer.eq(timer + 1)
        with m.Else():
            m.d.sync += self.tx.eq(1)
        return m


class UARTReceiver(wiring.Component):
    """8N1 receiver, sampling each bit in its middle.

    A byte whose stop bit is low (a framing error, as garbage or a break makes) is dropped and
    counted in ``errors``. A byte that arrives while the previous one is still not taken is
    dropped and counted too (``overruns``): the consumer is expected to keep up.

    Ports
    -----
    rx : ``In(1)``, asynchronous: synchronised inside.
    o : ``Out(stream.Signature(8))``
    errors, overruns : ``Out(8)``, wrapping counters.
    """

    rx: In(1, init=1)
    o: Out(stream.Signature(8))
    errors: Out(8)
    overruns: Out(8)

    def __init__(self, divisor):
        self.divisor = divisor
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        rx = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.rx, rx, init=1)
        timer = Signal(range(self.divisor * 3 // 2 + 1))
        shift = Signal(8)
        bit = Signal(range(9))

        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~rx):
                    # From the start bit's edge to the middle of the first data bit.
                    m.d.sync += [timer.eq(self.divisor * 3 // 2 - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer == 0):
                    m.d.sync += [shift.eq((rx << 7) | (shift >> 1)), timer.eq(self.divisor - 1),
                                 bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
            with m.State("STOP"):
                with m.If(timer == 0):
                    with m.If(~rx):
                        m.d.sync += self.errors.eq(self.errors + 1)
                        m.next = "BREAK"
                    with m.Else():
                        with m.If(self.o.valid & ~self.o.ready):
                            m.d.sync += self.overruns.eq(self.overruns + 1)
                        with m.Else():
                            m.d.sync += [self.o.payload.eq(shift), self.o.valid.eq(1)]
                        m.next = "IDLE"
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
            with m.State("BREAK"):
                # Wait for the line to return high before looking for the next start bit.
                with m.If(rx):
                    m.next = "IDLE"
        return m


class UART(wiring.Component):
    """A full-duplex 8N1 UART: :class:`UARTReceiver` and :class:`UARTTransmitter` side by side.

    ``divisor`` is the clock cycles per bit (see :func:`divisor_for`).
    """

    rx: In(1, init=1)
    tx: Out(1, init=1)
    i: In(stream.Signature(8))
    o: Out(stream.Signature(8))
    errors: Out(8)

    def __init__(self, divisor):
        self.divisor = divisor
        self.receiver = UARTReceiver(divisor)
        self.transmitter = UARTTransmitter(divisor)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.receiver = self.receiver
        m.submodules.transmitter = self.transmitter
        wiring.connect(m, wiring.flipped(self.i), self.transmitter.i)
        wiring.connect(m, self.receiver.o, wiring.flipped(self.o))
        m.d.comb += [
            self.receiver.rx.eq(self.rx),
            self.tx.eq(self.transmitter.tx),
            self.errors.eq(self.receiver.errors + self.receiver.overruns),
        ]
        return m
