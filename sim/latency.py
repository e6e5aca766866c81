"""A stream unit's latency, on Amaranth's simulator: one item in, and when it comes out."""

from amaranth.sim import Simulator

__all__ = ["one_item"]


def one_item(unit, fields, *, read=None, cycles=16):
    """Offer ``unit.i`` one item (``fields``: payload field name → value), its output always
    ready; return, for each cycle after it is taken that ``unit.o`` offers an item, the cycle
    and ``read(ctx)`` (the cycle alone without ``read``)."""
    seen = []

    async def bench(ctx):
        ctx.set(unit.o.ready, 1)
        for name, value in fields.items():
            ctx.set(getattr(unit.i.payload, name), value)
        ctx.set(unit.i.valid, 1)
        await ctx.tick()
        ctx.set(unit.i.valid, 0)
        for cycle in range(1, cycles):
            if ctx.get(unit.o.valid):
                seen.append(cycle if read is None else (cycle, read(ctx)))
            await ctx.tick()

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return seen
