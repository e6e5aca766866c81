"""Cycles per token of the engine, counted in simulation over a whole context.

python -m sim.cycles --model models/zen32.json [--device 85F] [--ways 4 --lanes 32] runs the
engine, in the shape the part's build chooses (or the one asked), under Icarus Verilog
(checking every token against the golden model as it goes) and prints the cycles of the step
at each position, their mean, and the MAC-bound floor for the multipliers used; then the
cycles of a prefill step (a prompt token whose next token is not asked for).
"""

import argparse
import json
import sys

from plan.options import add_model_argument, add_shape_arguments, model_and_plan

from .bench_engine import run_engine

__all__ = ["measure", "measure_prefill", "summary"]


def _run(model, plan, prefix, prompt, quiet):
    name, report = run_engine(model, plan.shape, [prompt], prefix=prefix, report=True, quiet=quiet,
                              loadable=plan.loadable)
    return json.loads(report.read_text())


def measure(model, plan, prefix="cycles", quiet=True):
    """Cycles of the (full) step at every position 0..seq_len−1 of ``model`` built as ``plan``,
    as a list: a one-token prompt, then generation to the end of the context."""
    cycles = dict(_run(model, plan, prefix, [0], quiet)["cycles"])
    return [cycles[p] for p in range(model.seq_len)]


def measure_prefill(model, plan, prefix="prefill", quiet=True):
    """Cycles of the prefill step at positions 0..seq_len−2, as a list: a prompt that fills
    the context, all but its last token prefill steps."""
    prompt = [p % model.vocab for p in range(model.seq_len)]
    cycles = dict(_run(model, plan, prefix, prompt, quiet)["prefill_cycles"])
    return [cycles[p] for p in range(model.seq_len - 1)]


def summary(plan, cycles):
    mean_cycles = sum(cycles) / len(cycles)
    seq_len = plan.model.seq_len
    return {
        "positions": {p: cycles[p] for p in sorted({0, seq_len // 2, seq_len - 1})},
        "mean_cycles": mean_cycles, "mean_macs": plan.mean_macs, "multipliers": plan.mac_multipliers,
        "floor": plan.floor_cycles, "ratio": mean_cycles / plan.floor_cycles,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sim.cycles", description=__doc__.splitlines()[0])
    add_model_argument(parser)
    add_shape_arguments(parser, device_help="the ULX3S part whose build's shape to count")
    model, plan = model_and_plan(parser, parser.parse_args(argv))
    print(model.identity_line)
    cycles = measure(model, plan)
    s = summary(plan, cycles)
    print(f"{plan.shape.describe()}; multipliers in MACs {s['multipliers']}")
    for pos, count in s["positions"].items():
        print(f"position {pos:4d}: {count} cycles")
    print(f"mean over {model.seq_len} positions: {s['mean_cycles']:.1f} cycles per token")
    print(f"MAC-bound floor: {s['mean_macs']:.0f} MACs / {s['multipliers']} multipliers = "
          f"{s['floor']:.1f} cycles; engine at {s['ratio']:.2f}x the floor")
    prefill = measure_prefill(model, plan)
    print(f"prefill (a prompt's tokens but its last): {min(prefill)}..{max(prefill)} cycles, "
          f"mean {sum(prefill) / len(prefill):.1f} per token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
