"""Signals that reach many cells: registers copied on purpose, and nets on a global buffer.

A register that feeds many far-apart cells (an input element that goes to every MAC lane's
multiplier) is faster as several copies, each near its share of the loads. Yosys merges
registers with the same inputs back into one unless the register cells are marked ``keep``;
Amaranth puts attributes on wires, not on the cells that drive them, so the synthesis script
marks the cells: every register whose signal is named ``…_replica…``.

An enable that reaches thousands of registers (a pipeline that can stall) is routed best on
one of the ECP5's global networks, as clocks are: nextpnr routes any net driven by a ``DCCA``
buffer there. Elsewhere (simulation, other parts) the net is used as it is.
"""

from amaranth.hdl import Instance, Signal

__all__ = ["replicas", "KEEP_REPLICAS", "global_net"]

KEEP_REPLICAS = "setattr -set keep 1 w:*_replica* %ci1:+[Q]"


def replicas(shape, count, name, *, init=None):
    """``count`` registers of ``shape`` to be driven alike, named so that synthesis keeps them."""
    return [Signal(shape, name=f"{name}_replica{index}", init=init) for index in range(count)]


def global_net(m, platform, signal, name):
    """``signal`` through a global buffer on an ECP5, for its many loads; ``signal`` elsewhere,
    and where the platform has no global networks to give (``global_buffers`` false: a unit
    placed out of context)."""
    if getattr(platform, "family", None) != "ecp5" or not getattr(platform, "global_buffers", True):
        return signal
    buffered = Signal(name=f"{name}_global")
    m.submodules[f"{name}_buffer"] = Instance("DCCA", i_CLKI=signal, i_CE=1, o_CLKO=buffered)
    return buffered
