"""Attention's score memories: where a score pass leaves its scores for the weight pass."""

from amaranth.hdl import Signal, signed
from amaranth.lib import memory

from .fanout import replicas

__all__ = ["score_memory"]


def score_memory(m, plan, group, bank, head):
    """A memory of one ``bank``'s and ``head``'s scores, a score a group of rows (``plan``: an
    :class:`plan.attention.AttentionPlan`): its write port, and the score of ``group`` as read
    ``1 + plan.score_read_stages`` cycles later.

    Where the memory is shallow, it is LUT RAM read as it is, from an address register of its
    own placed beside it (the same read, without a far shared address at the start of the gap's
    path), a cycle after the weight pass issues a group: it sees a score written in the cycle
    of the issue, as group 0's may be. Deeper, it is block RAM, whose slow output is held in a register
    before the gap; its read is not transparent (Yosys's bypass of a block RAM's read was the
    deep demo's critical path), and the weight pass never reads a group in the cycle it is
    written.
    """
    store = memory.Memory(shape=signed(plan.score_bits), depth=plan.groups, init=[],
                          attrs={"ram_style": "distributed" if plan.shallow_scores else "block"})
    m.submodules[f"scores{bank}_{head}"] = store
    write = store.write_port()
    if plan.shallow_scores:
        address = replicas(range(plan.groups), 1, f"score_address{bank}_{head}")[0]
        m.d.sync += address.eq(group)
        read = store.read_port(domain="comb")
        m.d.comb += read.addr.eq(address)
        return write, read.data
    read = store.read_port()
    m.d.comb += read.addr.eq(group)
    held = Signal.like(read.data, name=f"score_held{bank}_{head}")
    m.d.sync += held.eq(read.data)
    return write, held
