"""Cycles per token of the engine, counted in simulation over a whole context.

python -m sim.cycles --model models/zen32.json [--device 85F] [--ways 4 --lanes 32] runs the
engine, in the shape the part's build chooses (or the one asked), under Icarus Verilog
(checking every token against the golden model as it goes) and prints the cycles of the step
at each position, their mean, and the MAC-bound floor for the multipliers used; then the
cycles of a prefill step (a prompt token whose next token is not asked for). ``--timeline``
also prints, for the first and the last position, when each layer's intermediates leave their
unit, counted from the step's start: where the step waits for what.
"""

import argparse
import json
import sys

from plan.options import add_model_argument, add_shape_arguments, model_and_plan

from .bench_engine import LAYER_NAMES, TOP_NAMES, run_engine

__all__ = ["measure", "measure_context", "measure_prefill", "summary", "timeline_table"]


def _run(model, plan, prefix, prompt, quiet, progress):
    name, report = run_engine(model, plan.shape, [prompt], prefix=prefix, report=True, quiet=quiet,
                              loadable=plan.loadable, progress=progress)
    return json.loads(report.read_text())


def measure_context(model, plan, prefix="cycles", quiet=True, progress=None):
    """Cycles of the (full) step at every position 0..seq_len−1 of ``model`` built as ``plan``,
    as a list: a one-token prompt, then generation to the end of the context; and each step's
    timeline, by position: ``[name, layer, first cycle, last cycle]`` for each intermediate
    (``layer`` ``None``: the head's), counted from the step's start. ``progress``: the run's
    name in lines on stderr showing its steps done (none by default)."""
    report = _run(model, plan, prefix, [0], quiet, progress)
    cycles = dict(report["cycles"])
    return [cycles[p] for p in range(model.seq_len)], {int(p): t for p, t in report["timelines"].items()}


def measure(model, plan, prefix="cycles", quiet=True, progress=None):
    """Cycles of the (full) step at every position, as :func:`measure_context` counts them."""
    return measure_context(model, plan, prefix, quiet, progress)[0]


def measure_prefill(model, plan, prefix="prefill", quiet=True, progress=None):
    """Cycles of the prefill step at positions 0..seq_len−2, as a list: a prompt that fills
    the context, all but its last token prefill steps."""
    prompt = [p % model.vocab for p in range(model.seq_len)]
    cycles = dict(_run(model, plan, prefix, prompt, quiet, progress)["prefill_cycles"])
    return [cycles[p] for p in range(model.seq_len - 1)]


def summary(plan, cycles):
    mean_cycles = sum(cycles) / len(cycles)
    seq_len = plan.model.seq_len
    return {
        "positions": {p: cycles[p] for p in sorted({0, seq_len // 2, seq_len - 1})},
        "mean_cycles": mean_cycles, "mean_macs": plan.mean_macs, "multipliers": plan.mac_multipliers,
        "floor": plan.floor_cycles, "ratio": mean_cycles / plan.floor_cycles,
    }


def timeline_table(plan, timeline, cycles):
    """A step's timeline as text: a row per layer, a column per intermediate, each its first
    and last cycle; then the head's, and how many of the step's cycles the lanes issue words."""
    spans = {(name, layer): (first, last) for name, layer, first, last in timeline}

    def span(key):
        return f"{spans[key][0]}-{spans[key][1]}" if key in spans else "-"
    lines = [f"{'layer':>5s} " + " ".join(f"{name:>11s}" for name in LAYER_NAMES)]
    for layer in range(plan.model.n_layers):
        lines.append(f"{layer:5d} " + " ".join(f"{span((name, layer)):>11s}" for name in LAYER_NAMES))
    lines.append("head  " + ", ".join(f"{name} {span((name, None))}" for name in TOP_NAMES))
    lines.append(f"the lanes issue {plan.lane_words} words in the step's {cycles} cycles "
                 f"({cycles - plan.lane_words} waiting)")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sim.cycles", description=__doc__.splitlines()[0])
    add_model_argument(parser)
    add_shape_arguments(parser, device_help="the ULX3S part whose build's shape to count")
    parser.add_argument("--timeline", action="store_true",
                        help="print when each intermediate leaves its unit, at the first and the last position")
    args = parser.parse_args(argv)
    model, plan = model_and_plan(parser, args)
    print(model.identity_line)
    cycles, timelines = measure_context(model, plan, progress="simulating a generation to the end of the context")
    s = summary(plan, cycles)
    print(f"{plan.shape.describe()}; multipliers in MACs {s['multipliers']}")
    for pos, count in s["positions"].items():
        print(f"position {pos:4d}: {count} cycles")
    print(f"mean over {model.seq_len} positions: {s['mean_cycles']:.1f} cycles per token")
    print(f"MAC-bound floor: {s['mean_macs']:.0f} MACs / {s['multipliers']} multipliers = "
          f"{s['floor']:.1f} cycles; engine at {s['ratio']:.2f}x the floor")
    if args.timeline:
        for pos in (0, model.seq_len - 1):
            print(f"\nthe step at position {pos}: when each intermediate leaves its unit, first-last cycle of the step")
            print(timeline_table(plan, timelines[pos], cycles[pos]))
    prefill = measure_prefill(model, plan, progress="simulating a prompt that fills the context")
    print(f"prefill (a prompt's tokens but its last): {min(prefill)}..{max(prefill)} cycles, "
          f"mean {sum(prefill) / len(prefill):.1f} per token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
