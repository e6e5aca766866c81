"""The ULX3S: its ECP5 variants, the PLL from its 25 MHz oscillator, and the device's pins."""

from amaranth.hdl import ClockDomain, ClockSignal, Elaboratable, Instance, Module, ResetSignal, Signal
from amaranth.lib import io
from amaranth.lib.cdc import ResetSynchronizer
from amaranth_boards.ulx3s import (ULX3S_12F_Platform, ULX3S_25F_Platform, ULX3S_45F_Platform,
                                   ULX3S_85F_Platform)

from hdl.fanout import global_net
from hdl.top import DeviceTop

__all__ = ["PLATFORMS", "pll_parameters", "pll_clocks", "ULX3STop"]

PLATFORMS = {"12F": ULX3S_12F_Platform, "25F": ULX3S_25F_Platform,
             "45F": ULX3S_45F_Platform, "85F": ULX3S_85F_Platform}

OSCILLATOR_HZ = 25_000_000


def _pll_settings(in_hz):
    # The phase detector runs at 3.125–400 MHz and the VCO at 400–800 MHz (ECP5 sysCLOCK guide).
    for clki in range(1, 129):
        pfd = in_hz / clki
        if not 3.125e6 <= pfd <= 400e6:
            continue
        for clkfb in range(1, 81):
            out = pfd * clkfb
            clkop = next((d for d in range(1, 129) if 400e6 <= out * d <= 800e6), None)
            if clkop is not None:
                yield clki, clkfb, clkop, out


def pll_parameters(out_hz, in_hz=OSCILLATOR_HZ):
    """EHXPLLL dividers for ``out_hz``: ``(clki_div, clkfb_div, clkop_div, achieved_hz)``, the
    legal setting nearest ``out_hz``."""
    best = min(_pll_settings(in_hz), key=lambda setting: abs(setting[3] - out_hz), default=None)
    if best is None:
        raise ValueError(f"the PLL cannot make {out_hz} Hz from {in_hz} Hz")
    return best


def pll_clocks(in_hz=OSCILLATOR_HZ):
    """Every clock the PLL makes from ``in_hz``, in Hz, ascending."""
    return sorted({setting[3] for setting in _pll_settings(in_hz)})


class ULX3STop(Elaboratable):
    """The board top: the PLL makes the engine's clock, the device top (for a :class:`plan.Plan`
    and its :class:`plan.Contents`) meets the FTDI UART."""

    def __init__(self, plan, contents, *, clock_hz, baud):
        self.clki_div, self.clkfb_div, self.clkop_div, self.clock_hz = pll_parameters(clock_hz)
        self.device = DeviceTop(plan, contents, clock_hz=self.clock_hz, baud=baud)

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain("sync")
        clk25 = platform.request("clk25", dir="-")
        m.submodules.clk25 = clk25_buffer = io.Buffer("i", clk25)
        locked = Signal()
        clock = Signal()  # the PLL's output, named so that it can carry the timing constraint
        mhz = lambda hz: str(round(hz / 1e6, 3))
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=mhz(OSCILLATOR_HZ), a_FREQUENCY_PIN_CLKOP=mhz(self.clock_hz),
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=self.clki_div, p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=self.clkop_div,
            p_CLKOP_CPHASE=self.clkop_div - 1, p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
            p_CLKFB_DIV=self.clkfb_div,
            i_RST=0, i_STDBY=0, i_CLKI=clk25_buffer.i, o_CLKOP=clock,
            i_CLKFB=clock, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1,
            i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0, o_LOCK=locked,
        )
        m.d.comb += ClockSignal("sync").eq(clock)
        platform.add_clock_constraint(clock, self.clock_hz)
        # The reset, held until the PLL locks, reaches every register of the design: it leaves
        # its synchroniser (in a domain of its own, on the same clock) through a global buffer.
        m.domains.reset = ClockDomain("reset")
        m.d.comb += ClockSignal("reset").eq(clock)
        m.submodules.reset = ResetSynchronizer(~locked, domain="reset")
        m.d.comb += ResetSignal("sync").eq(global_net(m, platform, ResetSignal("reset"), "reset"))

        m.submodules.device = device = self.device
        uart = platform.request("uart", 0, dir={"rx": "-", "tx": "-", "rts": "-", "dtr": "-"})
        m.submodules.rx = rx = io.Buffer("i", uart.rx)
        m.submodules.tx = tx = io.Buffer("o", uart.tx)
        m.d.comb += [device.rx.eq(rx.i), tx.o.eq(device.tx)]
        tx_enable = platform.request("uart_tx_enable", 0, dir="-")
        m.submodules.tx_enable = tx_enable_buffer = io.Buffer("o", tx_enable)
        m.d.comb += tx_enable_buffer.o.eq(1)
        for i in range(8):
            led = platform.request("led", i, dir="-")
            m.submodules[f"led{i}"] = buffer = io.Buffer("o", led)
            m.d.comb += buffer.o.eq(device.leds[i])
        return m
