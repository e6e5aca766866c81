"""Cycles per token of the engine, counted in simulation over a whole context.

``python -m sim.cycles --model models/zen32.json [--device 85F] [--ways 4 --lanes 32]`` runs the
engine, in the shape the part's build chooses (or the one asked), under Icarus Verilog (checking every token against the golden model as it goes) and prints the cycles of
the step at each position, their mean, and the MAC-bound floor for the multipliers used;
then the cycles of a prefill step (a prompt token whose next token is not asked for).
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from boards.ulx3s import PARTS
from hdl.build import FitError, choose_shape
from hdl.engine import ATTENTION_ROWS, DEFAULT_ATTENTION_ROWS, Shape
from int8model.format import load

from .runner import BUILD_ROOT, run_bench

__all__ = ["shape_for", "measure", "measure_prefill", "macs_per_token", "multipliers", "floor_cycles"]


def macs_per_token(model, pos, qkv_table=False):
    """The MACs of the step at ``pos`` (without the QKV product's where q, k and v come
    from a table): the matrices', attention's."""
    d, dff, vocab = model.d_model, model.d_ff, model.vocab
    matrices = (1 if qkv_table else 4) * d * d + 2 * d * dff + vocab * d
    attention = 2 * (pos + 1) * d
    return matrices, attention


def multipliers(model, shape):
    """The engine's MAC multipliers: its lanes' (``ways`` each), and the attention unit's
    (``d_model`` for each cache row it reads a cycle)."""
    shape = shape.resolved(model)
    return shape.lanes * shape.ways + model.d_model * shape.attention_rows


def mean_macs(model, qkv_table=False):
    return sum(sum(macs_per_token(model, p, qkv_table)) for p in range(model.seq_len)) / model.seq_len


def floor_cycles(model, shape):
    """The MAC-bound floor: mean MACs per token over a context, over the multipliers."""
    return mean_macs(model, shape.resolved(model).qkv_table) / multipliers(model, shape)


def _run(model, shape, prefix, prompt, quiet):
    # A bench directory of its own for each model and shape (every field of it): runs of
    # different ones never share their generated Verilog.
    shape = shape.resolved(model)
    name = "_".join([prefix, model.sha256[:12], *(str(int(value)) for value in dataclasses.astuple(shape))])
    report = BUILD_ROOT / name / "cycles.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    params = {"model": model.to_json(), "prompts": [prompt], "seed": 0, "report": str(report),
              **dataclasses.asdict(shape)}
    run_bench(shape.engine(model), name=name, test_module="sim.bench_engine",
              params=params, testcase="generations_match_golden",
              log_file=report.parent / "simulation.log" if quiet else None)
    return json.loads(report.read_text())


def measure(model, shape, prefix="cycles", quiet=True):
    """Cycles of the (full) step at every position 0..seq_len−1, as a list: a one-token
    prompt, then generation to the end of the context."""
    cycles = dict(_run(model, shape, prefix, [0], quiet)["cycles"])
    return [cycles[p] for p in range(model.seq_len)]


def measure_prefill(model, shape, prefix="prefill", quiet=True):
    """Cycles of the prefill step at positions 0..seq_len−2, as a list: a prompt that fills
    the context, all but its last token prefill steps."""
    prompt = [p % model.vocab for p in range(model.seq_len)]
    cycles = dict(_run(model, shape, prefix, prompt, quiet)["prefill_cycles"])
    return [cycles[p] for p in range(model.seq_len - 1)]


def summary(model, shape, cycles):
    mean_cycles = sum(cycles) / len(cycles)
    floor = floor_cycles(model, shape)
    return {
        "positions": {p: cycles[p] for p in sorted({0, model.seq_len // 2, model.seq_len - 1})},
        "mean_cycles": mean_cycles, "mean_macs": mean_macs(model, shape.resolved(model).qkv_table),
        "multipliers": multipliers(model, shape), "floor": floor, "ratio": mean_cycles / floor,
    }


def shape_for(model, device="85F", ways=None, lanes=None, qkv_table=None, hidden_in_lanes=False,
              attention_rows=DEFAULT_ATTENTION_ROWS):
    """The :class:`~hdl.engine.Shape` to count: the lanes, ways and table asked, the rest as the
    part's build would choose them (:func:`hdl.build.choose_shape`, which raises
    :class:`~hdl.build.FitError` where none fits). A shape asked in full is counted whether or
    not a part would take it."""
    if ways and lanes:
        return Shape(lanes, ways, qkv_table=qkv_table, hidden_in_lanes=hidden_in_lanes,
                     attention_rows=attention_rows).resolved(model)
    return choose_shape(model, device, ways, lanes, qkv_table=qkv_table, hidden_in_lanes=hidden_in_lanes,
                        attention_rows=attention_rows)


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
        shape = shape_for(model, args.device, args.ways, args.lanes, args.qkv_table, args.hidden_in_lanes,
                          args.attention_rows)
    except FitError as error:
        parser.exit(2, f"{error}\nGive --ways and --lanes to count a shape that no part takes.\n")
    print(model.identity_line)
    cycles = measure(model, shape)
    s = summary(model, shape, cycles)
    print(f"{shape.lanes} lanes x {shape.ways} ways, multipliers in MACs {s['multipliers']}, "
          f"q, k, v {'from a table' if shape.qkv_table else 'computed'}"
          + (", the hidden vector in the lanes" if shape.hidden_in_lanes else "")
          + f", {shape.attention_rows} cache rows a cycle")
    for pos, count in s["positions"].items():
        print(f"position {pos:4d}: {count} cycles")
    print(f"mean over {model.seq_len} positions: {s['mean_cycles']:.1f} cycles per token")
    print(f"MAC-bound floor: {s['mean_macs']:.0f} MACs / {s['multipliers']} multipliers = "
          f"{s['floor']:.1f} cycles; engine at {s['ratio']:.2f}x the floor")
    prefill = measure_prefill(model, shape)
    print(f"prefill (a prompt's tokens but its last): {min(prefill)}..{max(prefill)} cycles, "
          f"mean {sum(prefill) / len(prefill):.1f} per token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
