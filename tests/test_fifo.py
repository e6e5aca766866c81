"""The stream queue and register slices: every item through, in order, whatever the stalls."""

import random

import pytest
from amaranth.sim import Simulator

from hdl.fifo import RegisterSlice, SkidBuffer, StreamFIFO


def run(unit, count=300, seed=1, send=0.7, take=0.6):
    """Random valid and ready on both sides; returns the items out and the cycles each waited."""
    rng = random.Random(seed)
    items = [rng.randrange(256) for _ in range(count)]
    got, waits = [], []

    async def bench(ctx):
        sent, entered = 0, {}
        for cycle in range(count * 20):
            offering = sent < count and rng.random() < send
            ready = rng.random() < take
            ctx.set(unit.i.valid, offering)
            ctx.set(unit.i.payload, items[sent] if offering else 0)
            ctx.set(unit.o.ready, ready)
            if offering and ctx.get(unit.i.ready):
                entered[sent] = cycle
                sent += 1
            if ctx.get(unit.o.valid) and ready:
                got.append(ctx.get(unit.o.payload))
                waits.append(cycle - entered[len(got) - 1])
            await ctx.tick()
            if len(got) == count:
                break

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == items
    return waits


@pytest.mark.parametrize("unit", [lambda: StreamFIFO(8, 4), lambda: StreamFIFO(8, 4, fall_through=True),
                                  lambda: StreamFIFO(8, 4, registered_head=True),
                                  lambda: StreamFIFO(8, 5, fall_through=True, registered_head=True),
                                  lambda: SkidBuffer(8), lambda: RegisterSlice(8)],
                         ids=["fifo", "fall_through", "registered_head", "both", "skid", "slice"])
@pytest.mark.parametrize("send, take", [(0.7, 0.6), (1.0, 1.0), (0.3, 0.9), (0.9, 0.2)])
def test_every_item_in_order(unit, send, take):
    run(unit(), send=send, take=take)


def test_fall_through_takes_no_cycle_when_empty():
    """An item offered to an empty queue with its consumer ready leaves in the same cycle."""
    assert set(run(StreamFIFO(8, 4, fall_through=True), send=0.3, take=1.0)) == {0}
    assert set(run(StreamFIFO(8, 4), send=0.3, take=1.0)) == {1}


@pytest.mark.parametrize("fall_through", [False, True])
@pytest.mark.parametrize("send, take", [(0.7, 0.6), (1.0, 1.0), (0.3, 0.9), (0.9, 0.2)])
def test_a_registered_head_takes_no_cycle_more(fall_through, send, take):
    """Under the same offers and stalls, every item waits as long as in the queue whose head is
    read from LUT RAM."""
    plain = run(StreamFIFO(8, 4, fall_through=fall_through), send=send, take=take)
    assert run(StreamFIFO(8, 4, fall_through=fall_through, registered_head=True), send=send, take=take) == plain
