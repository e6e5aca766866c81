from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from wire import DEFAULT_BAUD, Ident

from plan.loading import boot_pattern, load_targets

from .boot import BootReplay, connect_boot
from .engine import Engine
from .protocol import CommandProtocol
from .uart import UART, divisor_for

__all__ = ["DeviceTop"]


class DeviceTop(wiring.Component):
    """The whole device, short of clocks and pins: UART, command protocol and engine.

    The board top (``boards/``) adds the PLL and the pin buffers; the simulated board is this
    component itself, so the host driver talks to the very same logic in both.

    Parameters
    ----------
    plan : :class:`plan.Plan`
    contents : :class:`plan.Contents` or ``None``
        The memories' initial values; ``None``: zero (a loadable plan's always: its model comes
        over the line, ``LOAD`` and ``COMMIT``, and IDENT states its limits).
    boot : bytes or ``None``
        A loadable plan's boot image (``plan.boot_depth`` bytes, replayed at power-up:
        :class:`hdl.boot.BootReplay`); ``None``: :func:`plan.loading.boot_pattern`, no model.
    clock_hz : int
        The engine clock; with ``baud`` it sets the UART divisor and goes into IDENT.
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

    def __init__(self, plan, contents=None, *, boot=None, clock_hz, baud=DEFAULT_BAUD, frame_timeout=0.01):
        self.plan, self.clock_hz, self.baud = plan, clock_hz, baud
        self.divisor, self.baud_error = divisor_for(clock_hz, baud)
        if self.baud_error > 0.02:
            raise ValueError(f"{clock_hz} Hz cannot make {baud} baud within 2% "
                             f"(divisor {self.divisor} is {self.baud_error:.1%} off)")
        self.engine = Engine(plan, contents)
        model, shape, limits = plan.model, plan.shape, plan.limits
        stated = {} if limits is None else dict(
            loadable=1, max_nlut=limits.max_nlut, exp_bits=limits.exp_bits, multiplier_bits=limits.multiplier_bits,
            embedding_bits=limits.embedding_bits, residual_bits=limits.residual_bits, hidden_bits=limits.hidden_bits)
        self.ident = Ident(model.sha256 or "00" * 32, model.d_model, model.n_heads, model.d_ff, model.vocab,
                           model.seq_len, model.n_layers, shape.lanes, int(clock_hz), int(baud), shape.ways,
                           shape.lut_ways, **stated)
        # A loadable build powers up with no model: it runs once one is committed.
        load_sizes = tuple(target.size for target in load_targets(plan)) if plan.loadable else None
        self.protocol = CommandProtocol(seq_len=model.seq_len, vocab=model.vocab, ident=self.ident.pack(),
                                        timeout=round(frame_timeout * clock_hz), load_sizes=load_sizes,
                                        holds_model=not plan.loadable)
        self.uart = UART(self.divisor)
        if boot is not None and len(boot) != plan.boot_depth:
            raise ValueError(f"the plan's boot image has {plan.boot_depth} bytes, not {len(boot)}")
        self.boot = BootReplay(boot_pattern(plan.boot_depth) if boot is None else boot) if plan.boot else None
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = engine = self.engine
        m.submodules.protocol = protocol = self.protocol
        m.submodules.uart = uart = self.uart
        if self.boot is None:
            wiring.connect(m, uart.o, protocol.rx)
            wiring.connect(m, protocol.tx, uart.i)
        else:
            connect_boot(m, self.boot, uart.o, uart.i, protocol)
        wiring.connect(m, protocol.engine.cmd, engine.cmd)
        wiring.connect(m, engine.tokens, protocol.engine.tokens)
        m.d.comb += protocol.engine.status.eq(engine.status)
        if self.plan.loadable:
            wiring.connect(m, protocol.load, engine.load)
        m.d.comb += [uart.rx.eq(self.rx), self.tx.eq(uart.tx)]
        pos_bits = engine.status.pos.shape().width
        m.d.comb += self.leds.eq(engine.status.busy | ((engine.status.error != 0) << 1)
                                 | (~self.rx << 2) | (~self.tx << 3)
                                 | (engine.status.pos[max(0, pos_bits - 4):] << 4))
        return m
