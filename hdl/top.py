from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .engine import Shape
from .protocol import CommandProtocol, ident_payload
from .uart import UART, divisor_for

__all__ = ["DeviceTop"]

DEFAULT_BAUD = 3_000_000


class DeviceTop(wiring.Component):
    """The whole device, short of clocks and pins: UART, command protocol and engine.

    The board top (``boards/``) adds the PLL and the pin buffers; the simulated board is this
    component itself, so the host driver talks to the very same logic in both.

    Parameters
    ----------
    model : :class:`~int8model.format.Model`
    clock_hz : int
        The engine clock; with ``baud`` it sets the UART divisor and goes into IDENT.
    shape : :class:`~.engine.Shape`
        The engine's lanes, ways and the rest (the defaults: :class:`~.engine.Shape`'s).
    frame_timeout : float
        Seconds of silence inside a frame after which it is dropped as truncated. USB serial
        adapters deliver a frame in packets up to a millisecond apart, so 10 ms by default.

    Ports
    -----
    rx : ``In(1)``, tx : ``Out(1)``: the serial line (8N1, idle high).
    leds : ``Out(8)``: busy, error, receive activity, transmit activity, the position's top bits.
    """

    rx: In(1, init=1)
    tx: Out(1, init=1)
    leds: Out(8)

    def __init__(self, model, *, clock_hz, baud=DEFAULT_BAUD, shape=Shape(), frame_timeout=0.01):
        self.model, self.clock_hz, self.baud = model, clock_hz, baud
        self.divisor, self.baud_error = divisor_for(clock_hz, baud)
        if self.baud_error > 0.02:
            raise ValueError(f"{clock_hz} Hz cannot make {baud} baud within 2% "
                             f"(divisor {self.divisor} is {self.baud_error:.1%} off)")
        self.engine = shape.engine(model)
        self.lanes = self.engine.lanes
        ident = ident_payload(model, self.lanes, clock_hz, baud, shape.ways, shape.lut_ways)
        self.protocol = CommandProtocol(model, ident=ident, timeout=round(frame_timeout * clock_hz))
        self.uart = UART(self.divisor)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = engine = self.engine
        m.submodules.protocol = protocol = self.protocol
        m.submodules.uart = uart = self.uart
        wiring.connect(m, uart.o, protocol.rx)
        wiring.connect(m, protocol.tx, uart.i)
        wiring.connect(m, protocol.cmd, engine.cmd)
        wiring.connect(m, engine.tokens, protocol.tokens)
        m.d.comb += [
            protocol.status.eq(engine.status),
            uart.rx.eq(self.rx),
            self.tx.eq(uart.tx),
        ]
        pos_bits = engine.status.pos.shape().width
        m.d.comb += self.leds.eq(engine.status.busy | ((engine.status.error != 0) << 1)
                                 | (~self.rx << 2) | (~self.tx << 3)
                                 | (engine.status.pos[max(0, pos_bits - 4):] << 4))
        return m
