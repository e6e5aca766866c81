"""The small units: the arg-max head and the KV cache."""

import pytest

from hdl.argmax import ArgMax
from hdl.kv_cache import KVCache
from plan.units import CachePlan, argmax_plan
from sim.latency import one_item
from sim.runner import run_bench


@pytest.mark.parametrize("bits, length, ways", [(20, 32, 1), (8, 1, 1), (33, 256, 1), (20, 32, 3), (8, 7, 2),
                                                (12, 5, 4), (20, 32, 32), (19, 256, 32), (9, 40, 7), (6, 3, 5)])
def test_argmax(bits, length, ways):
    """Words from one value (a run's stages only) to a whole head of 32 lanes (a tournament
    three stages deep), runs shorter than a word among them."""
    params = {"bits": bits, "length": length, "seed": bits, "count": 300, "ways": ways}
    run_bench(ArgMax(argmax_plan(bits, length, ways)), name=f"argmax_{bits}_{length}_{ways}",
              test_module="sim.bench_argmax", params=params)


@pytest.mark.parametrize("d_model, seq_len, banks", [(8, 8, 1), (32, 32, 1), (64, 5, 1), (32, 32, 2), (8, 7, 2),
                                                      (16, 9, 4)])
def test_kv_cache(d_model, seq_len, banks):
    params = {"d_model": d_model, "seq_len": seq_len, "seed": seq_len, "rounds": 4, "banks": banks}
    run_bench(KVCache(CachePlan(d_model, seq_len, banks)), name=f"kv_cache_{d_model}_{seq_len}_{banks}",
              test_module="sim.bench_kv_cache", params=params)


def test_kv_cache_banks_are_a_power_of_two():
    with pytest.raises(ValueError, match="3 banks"):
        KVCache(CachePlan(8, 8, 3))


@pytest.mark.parametrize("divisor", [4, 15, 33])
def test_uart(divisor):
    from hdl.uart import UART
    run_bench(UART(divisor), name=f"uart_{divisor}", test_module="sim.bench_uart",
              params={"divisor": divisor, "seed": divisor})


def test_uart_divisor_is_checked():
    from hdl.uart import divisor_for
    assert divisor_for(45_000_000, 3_000_000) == (15, 0.0)
    with pytest.raises(ValueError, match="too slow"):
        divisor_for(9_000_000, 3_000_000)


@pytest.mark.parametrize("length, ways, cycles", [(32, 32, 5), (33, 32, 6), (1, 1, 1), (7, 2, 2), (3, 5, 3)])
def test_argmax_latency(length, ways, cycles):
    """Cycles from a run's last word taken to its index offered: where a run is one word
    (``length <= ways``, the engine's head), the tournament's last stage is the output."""
    unit = ArgMax(argmax_plan(20, length, ways))
    values = [(7 * k) % 11 - 5 for k in range(ways)]
    count = min(length, ways)
    seen = one_item(unit, {"values": values, "count": count, "last": 1}, read=lambda ctx: ctx.get(unit.o.payload))
    assert unit.latency == cycles
    assert seen == [(cycles, max(range(count), key=lambda k: (values[k], -k)))]
