"""The engine against a CPU core, side by side: python -m bench.speed

For the shipped model and seed-size random models, from one run: the engine's cycles per
token counted in simulation (mean over a whole context) at the clock the built ULX3S-85F
bitstream runs at (a random model's own build, where its report is given, else the shipped
model's), and the tokens a host receives of a GENERATE to the end of the context over the serial
line at the build's baud (``wire.line``); the
golden NumPy model and a compiled C decoder on one core of this machine (its
tokens checked against the golden model's), both as the reference computes and, where the
engine reads q, k and v from a table of every token and position, with the same table; the
MAC-bound floor for the multipliers the engine uses; and the engine's prefill cycles per
prompt token. Also writes a plot of cycles per token against position, and a table of cycles
per token for d_model 16, 32 and 64.
"""

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

from int8model import Golden, load
from int8model.synthetic import random_model
from plan import FitError, Shape, choose_plan, make_plan
from hdl.uart import divisor_for
from plan.options import add_model_argument, add_shape_arguments, asked_shape
from sim.cycles import measure, measure_prefill
from wire import DEFAULT_BAUD
from wire.line import generation_on_the_line

from .timing import TIMING_RUNS, c_ns_per_token
from .deep import deep_table

__all__ = ["report_shape", "random_models", "benchmark_models", "clock_for", "main"]


def golden_us_per_token(model, prompt, repetitions=20):
    golden = Golden(model)
    count = model.seq_len - len(prompt) + 1
    times = []
    for _ in range(TIMING_RUNS):
        started = time.perf_counter()
        for _ in range(repetitions):
            for _ in golden.generate(prompt, count):
                pass
        times.append((time.perf_counter() - started) / (repetitions * model.seq_len) * 1e6)
    return min(times)


def report_shape(report):
    """The engine's :class:`~plan.Shape` as a build report's plan records it."""
    return Shape(**report["plan"]["shape"])


def random_models():
    """The benchmark's two seed-size random models, by label."""
    return {f"random seed-size #{seed}": random_model(np.random.default_rng(seed), 32, 4, 32, 32, 32)
            for seed in (1, 2)}


def benchmark_models(shipped, label):
    """The models benchmarked, by label: the shipped one, then the random ones."""
    return {label: shipped, **random_models()}


def clock_for(model, reports, default):
    """The clock (MHz) of the bitstream of the build report of ``model`` (matched by its
    sha256), ``None`` and ``default`` where there is none: a random model's design differs from
    the shipped one's beyond its memories (its r_ctx and r_hid take logic the shipped model's do not)."""
    for report in reports:
        if report.get("model_sha256") == model.sha256:
            return report["clock_hz"] / 1e6, report
    return default, None


def host_tokens_per_second(cycles, clock_mhz, baud):
    """Tokens a second a host receives of a GENERATE to the end of the context after a
    one-token prompt, the engine at ``clock_mhz`` and the line at ``baud``."""
    divisor, _ = divisor_for(clock_mhz * 1e6, baud)
    line_cycles, _ = generation_on_the_line(cycles[1:], divisor)
    return len(cycles) * clock_mhz * 1e6 / line_cycles


def plot(path, series):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 4))
    # Models of one size may take the same cycles at every position: a line style each keeps
    # every series in sight where they overlap.
    for (label, cycles), style in zip(series.items(), itertools.cycle(["-", "--", ":", "-."])):
        axes.plot(range(len(cycles)), cycles, marker=".", linestyle=style, label=label)
    axes.set_xlabel("position")
    axes.set_ylabel("cycles per token")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend()
    axes.set_title("decode step, cycles per token (simulated)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.speed", description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--report", type=Path, default=Path("build/ulx3s/report.json"),
                        help="the build report whose clock, baud and shape to use (python -m hdl.build writes it; "
                             "default: %(default)s)")
    parser.add_argument("--model-report", type=Path, action="append", default=[],
                        help="the build report of a random model of the benchmark (hdl.build --model of a file "
                             "that --write-models wrote), whose clock to use for it (repeatable; default: a model "
                             "takes the shipped model's)")
    parser.add_argument("--write-models", type=Path, metavar="DIR",
                        help="write the benchmark's random models into DIR as model files (to build them), and stop "
                             "(default: run the benchmark)")
    parser.add_argument("--clock", type=float, metavar="MHZ",
                        help="the engine's clock in MHz, instead of a build report's (default: the report's)")
    add_shape_arguments(parser, device_help="with --clock, or shape options: the part whose build's shape to count")
    parser.add_argument("--out", type=Path, default=Path("build/bench"),
                        help="where the plot goes (default: %(default)s)")
    parser.add_argument("--deep", action="store_true",
                        help="also the deep models' table: the deep demo and random models of 1, 2 and 4 layers at "
                             "d_model 64, each simulated over a whole context (tens of minutes; default: off)")
    parser.add_argument("--deep-model", type=Path, default=Path("models/kjv4.json"),
                        help="the deep demo model (default: %(default)s)")
    parser.add_argument("--deep-report", type=Path,
                        help="the deep demo's build report, for its fmax, clock and utilisation "
                             "(default: none, cycles only)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.write_models:
        args.write_models.mkdir(parents=True, exist_ok=True)
        for label, model in random_models().items():
            path = args.write_models / (label.replace(" ", "_").replace("#", "") + ".json")
            model.save(path)
            print(f"{path}: {model.identity_line}")
        return 0

    asked = asked_shape(args)
    shape_asked = asked != Shape(ways=None, lut_ways=None)
    device = args.device
    baud = DEFAULT_BAUD
    if args.clock:
        clock, source = args.clock, "given"
    elif args.report.exists():
        report = json.loads(args.report.read_text())
        clock, baud = report["clock_hz"] / 1e6, report["baud"]
        source = (f"{args.report} ({report['device']}, {report['identity'][13:25]}…, "
                  f"nextpnr fmax {report['fmax_mhz']:.2f} MHz)")
        if not shape_asked:
            device, asked = report["device"], report_shape(report)
    else:
        print(f"error: no build report at {args.report}: run python -m hdl.build --board ulx3s first, "
              "or give --clock", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    shipped = load(args.model)
    shape = choose_plan(shipped, device, asked).shape
    models = benchmark_models(shipped, "shipped " + args.model.stem)
    model_reports = [json.loads(path.read_text()) for path in args.model_report]
    prompt = [1, 2, 3]
    print(f"the bitstream's clock {clock:.3f} MHz, from {source}; {shape.describe()}; "
          f"host: a GENERATE to the end of the context over the line at {baud} baud")
    print("C: the reference's arithmetic; C+table: q, k, v from the engine's table (where it has one); "
          f"CPU figures: the fastest of {TIMING_RUNS} runs on one core")
    header = (f"{'model':24s} {'q,k,v':>8s} {'cycles/tok':>10s} {'floor':>6s} {'clock MHz':>9s} {'engine us':>9s} "
              f"{'engine tok/s':>12s} {'host tok/s':>10s} {'C us':>6s} {'C tok/s':>9s} {'C+table us':>10s} {'NumPy us':>8s} "
              f"{'engine/C':>8s} {'engine/C+table':>14s} {'prefill cyc':>11s} {'prefill tok/s':>13s}")
    print(header)
    series = {}
    for label, model in models.items():
        plan = make_plan(model, shape)  # the shipped model's shape
        cycles = measure(model, plan, prefix="bench")
        series[label] = cycles
        mean = sum(cycles) / len(cycles)
        # The model's own build where there is one (marked *), else the shipped model's clock.
        model_clock, own = clock_for(model, model_reports, clock)
        engine_us = mean / model_clock
        c_us = c_ns_per_token(model, prompt) / 1000
        c_table_us = c_ns_per_token(model, prompt, qkv_table=True) / 1000 if plan.qkv.table else c_us
        numpy_us = golden_us_per_token(model, prompt)
        prefill = measure_prefill(model, plan, prefix="bench_prefill")
        prefill_mean = sum(prefill) / len(prefill)
        print(f"{label:24s} {'table' if plan.qkv.table else 'computed':>8s} {mean:10.1f} "
              f"{plan.floor_cycles:6.1f} {model_clock:8.3f}{'*' if own else ' '} {engine_us:9.3f} "
              f"{1e6 / engine_us:12.0f} {host_tokens_per_second(cycles, model_clock, baud):10.0f} {c_us:6.3f} {1e6 / c_us:9.0f} {c_table_us:10.3f} {numpy_us:8.1f} "
              f"{c_us / engine_us:7.2f}x {c_table_us / engine_us:13.2f}x "
              f"{prefill_mean:11.1f} {model_clock * 1e6 / prefill_mean:13.0f}", flush=True)
    print("* the model's own build; the other rows take the shipped model's clock")
    plot(args.out / "cycles_per_position.png", series)
    print(f"plot: {args.out / 'cycles_per_position.png'}")

    print(f"\ncycles per token by d_model (n_heads 4, d_ff = d_model, vocab 32, seq_len 32), each with the "
          f"lanes and ways the {device}'s build chooses")
    print(f"{'d_model':>7s} {'lanes x ways (LUT)':>18s} {'q,k,v':>8s} {'pos 0':>6s} {'pos 16':>6s} {'pos 31':>6s} "
          f"{'mean':>7s} {'floor':>6s}")
    for d in (16, 32, 64):
        model = random_model(np.random.default_rng(d), d, 4, d, 32, 32)
        try:
            plan = choose_plan(model, device, Shape(ways=asked.ways, lut_ways=None, qkv_table=asked.qkv_table,
                                                    hidden_in_lanes=shape.hidden_in_lanes,
                                                    attention_rows=shape.attention_rows))
        except FitError:
            print(f"{d:7d}  does not fit the {device}", flush=True)
            continue
        cycles = measure(model, plan, prefix="bench")
        s = plan.shape
        print(f"{d:7d} {f'{s.lanes} x {s.ways} ({s.lut_ways})':>18s} "
              f"{'table' if plan.qkv.table else 'computed':>8s} "
              f"{cycles[0]:6d} {cycles[16]:6d} {cycles[31]:6d} {sum(cycles) / len(cycles):7.1f} "
              f"{plan.floor_cycles:6.1f}", flush=True)
    if args.deep:
        deep_report = json.loads(args.deep_report.read_text()) if args.deep_report else None
        deep_table(args.deep_model, deep_report, device, partial(measure, prefix="bench_deep"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
