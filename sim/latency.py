"""A stream unit's latency, on Amaranth's simulator: an input in, and when its outputs come out."""

from amaranth.sim import Simulator

__all__ = ["outputs_after", "one_item", "hidden_pair_timing"]


def outputs_after(unit, offer, read, cycles):
    """Run ``offer(ctx)`` (it returns in the cycle its input is taken), ``unit.o`` always
    ready; return, for each later cycle in which ``unit.o`` offers an item, the cycle counted
    from that one, with ``read(ctx)`` where given."""
    seen = []

    async def bench(ctx):
        ctx.set(unit.o.ready, 1)
        await offer(ctx)
        for cycle in range(1, cycles):
            if ctx.get(unit.o.valid):
                seen.append(cycle if read is None else (cycle, read(ctx)))
            await ctx.tick()

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return seen


def one_item(unit, fields, *, read=None, cycles=16):
    """Offer ``unit.i`` one item (``fields``: payload field name → value), its output always
    ready; return, for each cycle after it is taken that ``unit.o`` offers an item, the cycle
    and ``read(ctx)`` (the cycle alone without ``read``)."""
    async def offer(ctx):
        for name, value in fields.items():
            ctx.set(getattr(unit.i.payload, name), value)
        ctx.set(unit.i.valid, 1)
        await ctx.tick()
        ctx.set(unit.i.valid, 0)
    return outputs_after(unit, offer, read, cycles)


def hidden_pair_timing(unit, *, cycles=64):
    """Feed a :class:`~hdl.matvec.MatVec` one vector of the first of its ``hidden`` pair, a word
    a cycle, its output always ready; return the cycles, counted from the one that takes the
    last input word, in which the second's words leave on ``o``."""
    async def offer(ctx):
        first = unit.plan.hidden.first
        ctx.set(unit.i.payload.matrix, first)
        ctx.set(unit.i.valid, 1)
        for _ in range(unit.plan.steps[first]):
            await ctx.tick().until(unit.i.ready)
        ctx.set(unit.i.valid, 0)
    return outputs_after(unit, offer, None, cycles)
