"""Cycles per token of the engine, counted in simulation over a whole context.

``python -m sim.cycles --model models/zen32.json [--device 85F] [--ways 4 --lanes 32]`` runs the
engine, in the shape the part's build chooses (or the one asked), under Icarus Verilog (checking every token against the golden model as it goes) and prints the cycles of
the step at each position, their mean, and the MAC-bound floor for the multipliers used;
then the cycles of a prefill step (a prompt token whose next token is not asked for).
"""

import argparse
import json
import sys
from pathlib import Path

from boards.ulx3s import PARTS
from hdl.build import FitError, choose_ways
from hdl.engine import ATTENTION_ROWS, DEFAULT_ATTENTION_ROWS, Engine, qkv_table_fits
from int8model.format import load

from .runner import BUILD_ROOT, run_bench

__all__ = ["shape", "measure", "measure_prefill", "macs_per_token", "multipliers", "floor_cycles"]


def macs_per_token(model, pos, qkv_table=False):
    """The MACs of the step at ``pos`` (without the QKV product's where q, k and v come
    from a table): the matrices', attention's."""
    d, dff, vocab = model.d_model, model.d_ff, model.vocab
    matrices = (1 if qkv_table else 4) * d * d + 2 * d * dff + vocab * d
    attention = 2 * (pos + 1) * d
    return matrices, attention


def multipliers(model, lanes, ways, attention_rows=DEFAULT_ATTENTION_ROWS):
    """The engine's MAC multipliers: its lanes' (``ways`` each), and the attention unit's
    (``d_model`` for each cache row it reads a cycle)."""
    return lanes * ways + model.d_model * attention_rows


def mean_macs(model, qkv_table=False):
    return sum(sum(macs_per_token(model, p, qkv_table)) for p in range(model.seq_len)) / model.seq_len


def floor_cycles(model, lanes, ways, qkv_table=False, attention_rows=DEFAULT_ATTENTION_ROWS):
    """The MAC-bound floor: mean MACs per token over a context, over the multipliers."""
    return mean_macs(model, qkv_table) / multipliers(model, lanes, ways, attention_rows)


def _run(model, lanes, ways, name, prompt, quiet, qkv_table, hidden_in_lanes, attention_rows):
    report = BUILD_ROOT / name / "cycles.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    params = {"model": model.to_json(), "lanes": lanes, "prompts": [prompt], "seed": 0,
              "report": str(report), "ways": ways, "qkv_table": qkv_table, "hidden_in_lanes": hidden_in_lanes,
              "attention_rows": attention_rows}
    engine = Engine(model, lanes=lanes, ways=ways, attention_rows=attention_rows, qkv_table=qkv_table,
                    hidden_in_lanes=hidden_in_lanes)
    run_bench(engine, name=name, test_module="sim.bench_engine",
              params=params, testcase="generations_match_golden",
              log_file=report.parent / "simulation.log" if quiet else None)
    return json.loads(report.read_text())


def measure(model, lanes, ways, name="cycles", quiet=True, qkv_table=None, hidden_in_lanes=False,
            attention_rows=DEFAULT_ATTENTION_ROWS):
    """Cycles of the (full) step at every position 0..seq_len−1, as a list: a one-token
    prompt, then generation to the end of the context."""
    cycles = dict(_run(model, lanes, ways, name, [0], quiet, qkv_table, hidden_in_lanes, attention_rows)["cycles"])
    return [cycles[p] for p in range(model.seq_len)]


def measure_prefill(model, lanes, ways, name="prefill", quiet=True, qkv_table=None, hidden_in_lanes=False,
                    attention_rows=DEFAULT_ATTENTION_ROWS):
    """Cycles of the prefill step at positions 0..seq_len−2, as a list: a prompt that fills
    the context, all but its last token prefill steps."""
    prompt = [p % model.vocab for p in range(model.seq_len)]
    cycles = dict(_run(model, lanes, ways, name, prompt, quiet, qkv_table, hidden_in_lanes,
                       attention_rows)["prefill_cycles"])
    return [cycles[p] for p in range(model.seq_len - 1)]


def summary(model, lanes, ways, cycles, qkv_table=False, attention_rows=DEFAULT_ATTENTION_ROWS):
    mean_cycles = sum(cycles) / len(cycles)
    floor = floor_cycles(model, lanes, ways, qkv_table, attention_rows)
    return {
        "positions": {p: cycles[p] for p in sorted({0, model.seq_len // 2, model.seq_len - 1})},
        "mean_cycles": mean_cycles, "mean_macs": mean_macs(model, qkv_table),
        "multipliers": multipliers(model, lanes, ways, attention_rows), "floor": floor, "ratio": mean_cycles / floor,
    }


def shape(model, device="85F", ways=None, lanes=None, qkv_table=None):
    """The lanes, ways and whether q, k, v come from a table, to count: those asked, the rest
    as the part's build would choose them (:func:`hdl.build.choose_ways`, which raises
    :class:`~hdl.build.FitError` where none fits). A shape asked in full is counted whether or
    not a part would take it."""
    if ways and lanes:
        return lanes, ways, qkv_table_fits(model) if qkv_table is None else qkv_table
    ways, _, lanes, table = choose_ways(model, device, ways, lanes, qkv_table=qkv_table)
    return lanes, ways, table


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sim.cycles", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/zen32.json"))
    parser.add_argument("--device", choices=sorted(PARTS), default="85F",
                        help="the ULX3S part whose build's shape to count (default: %(default)s)")
    parser.add_argument("--ways", type=int, help="elements a cycle between the units (default: the build's)")
    parser.add_argument("--lanes", type=int, help="MAC lanes (default: the build's)")
    parser.add_argument("--qkv-table", action=argparse.BooleanOptionalAction, default=None,
                        help="q, k and v from a table of every token and position (default: the build's)")
    parser.add_argument("--hidden-in-lanes", action="store_true",
                        help="the FFN's hidden vector kept in the MAC lanes (as hdl.build's option)")
    parser.add_argument("--attention-rows", type=int, choices=ATTENTION_ROWS, default=DEFAULT_ATTENTION_ROWS,
                        help="cache rows attention reads a cycle (as hdl.build's option; default: %(default)s)")
    args = parser.parse_args(argv)
    model = load(args.model)
    try:
        lanes, ways, table = shape(model, args.device, args.ways, args.lanes, args.qkv_table)
    except FitError as error:
        parser.exit(2, f"{error}\nGive --ways and --lanes to count a shape that no part takes.\n")
    print(model.identity_line)
    options = {"qkv_table": table, "hidden_in_lanes": args.hidden_in_lanes, "attention_rows": args.attention_rows}
    cycles = measure(model, lanes, ways, **options)
    s = summary(model, lanes, ways, cycles, table, args.attention_rows)
    print(f"{lanes} lanes x {ways} ways, multipliers in MACs {s['multipliers']}, "
          f"q, k, v {'from a table' if table else 'computed'}"
          + (", the hidden vector in the lanes" if args.hidden_in_lanes else "")
          + f", {args.attention_rows} cache rows a cycle")
    for pos, count in s["positions"].items():
        print(f"position {pos:4d}: {count} cycles")
    print(f"mean over {model.seq_len} positions: {s['mean_cycles']:.1f} cycles per token")
    print(f"MAC-bound floor: {s['mean_macs']:.0f} MACs / {s['multipliers']} multipliers = "
          f"{s['floor']:.1f} cycles; engine at {s['ratio']:.2f}x the floor")
    prefill = measure_prefill(model, lanes, ways, **options)
    print(f"prefill (a prompt's tokens but its last): {min(prefill)}..{max(prefill)} cycles, "
          f"mean {sum(prefill) / len(prefill):.1f} per token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
