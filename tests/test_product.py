from amaranth.hdl import Module, Signal, signed
from amaranth.sim import Simulator

from hdl.product import nibble_products


def test_nibble_products_make_every_int8_product():
    """All 65,536 int8 × int8 pairs, against Python's product."""
    a, b = Signal(signed(8)), Signal(signed(8))
    low, high = Signal(signed(13)), Signal(signed(12))
    m = Module()
    low_part, high_part = nibble_products(a, b)
    m.d.comb += [low.eq(low_part), high.eq(high_part)]
    wrong = []

    async def bench(ctx):
        for x in range(-128, 128):
            ctx.set(a, x)
            for y in range(-128, 128):
                ctx.set(b, y)
                if ctx.get(low) + (ctx.get(high) << 4) != x * y:
                    wrong.append((x, y))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not wrong, f"{len(wrong)} products differ, the first {wrong[:5]}"
