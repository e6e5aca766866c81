"""The engine against a CPU core, side by side: ``python -m bench.speed``.

For the shipped model and seed-size random models, from one run: the engine's cycles per
token counted in simulation (mean over a whole context) times the fmax of the built ULX3S-85F
design (a random model's own build, where its report is given, else the shipped model's); the
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
from pathlib import Path

import numpy as np

from int8model import Golden, load
from int8model.synthetic import random_model
from hdl.build import FitError, choose_shape
from hdl.engine import Shape
from sim.cycles import floor_cycles, measure, measure_prefill

from .c_decoder import CDecoder

__all__ = ["report_shape", "random_models", "benchmark_models", "fmax_for", "main"]


# A CPU figure is the fastest of a few runs (for the C decoder, of every repetition of a whole
# context in them): another process sharing the core only ever slows a run down (one such run,
# beside a simulation, once took eight times as long; a run's mean, on an idle virtual machine,
# still varied by half from one benchmark to the next).
TIMING_RUNS = 5


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


def c_ns_per_token(model, prompt, qkv_table=False):
    decoder = CDecoder(model, qkv_table=qkv_table)
    try:
        runs = [decoder.run(prompt, repetitions=2000) for _ in range(TIMING_RUNS)]
    finally:
        decoder.close()
    want = [t.next for t in Golden(model).generate(prompt, model.seq_len - len(prompt) + 1)]
    if any(tokens != want for tokens, _ in runs):
        raise AssertionError("the C decoder disagrees with the golden model")
    return min(ns for _, ns in runs)


def report_shape(report):
    """The engine's :class:`~hdl.engine.Shape` as a build report records it (a field that an
    older report lacks: its default)."""
    return Shape(**{field.name: report[field.name] for field in dataclasses.fields(Shape) if field.name in report})


def random_models():
    """The benchmark's two seed-size random models, by label."""
    return {f"random seed-size #{seed}": random_model(np.random.default_rng(seed), 32, 4, 32, 32, 32)
            for seed in (1, 2)}


def benchmark_models(shipped, label):
    """The models benchmarked, by label: the shipped one, then the random ones."""
    return {label: shipped, **random_models()}


def fmax_for(model, reports, default):
    """The fmax (MHz) of the build report of ``model`` (matched by its sha256), ``None`` and
    ``default`` where there is none: a random model's design differs from the shipped one's
    beyond its memories (its r_ctx and r_hid take logic the shipped model's do not)."""
    for report in reports:
        if report.get("model_sha256") == model.sha256:
            return report["fmax_mhz"], report
    return default, None


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
    parser.add_argument("--model", type=Path, default=Path("models/zen32.json"))
    parser.add_argument("--report", type=Path, default=Path("build/ulx3s/report.json"),
                        help="the build report whose fmax to use (python -m hdl.build writes it)")
    parser.add_argument("--model-report", type=Path, action="append", default=[],
                        help="the build report of a random model of the benchmark (hdl.build --model of a file "
                             "that --write-models wrote), whose fmax to use for it (repeatable; without one, "
                             "a model takes the shipped model's)")
    parser.add_argument("--write-models", type=Path, metavar="DIR",
                        help="write the benchmark's random models into DIR as model files (to build them), and stop")
    parser.add_argument("--fmax", type=float, help="fmax in MHz, instead of a build report's")
    parser.add_argument("--ways", type=int, help="elements a cycle (default: the build report's, else as the "
                                                 "85F's build would choose)")
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.write_models:
        args.write_models.mkdir(parents=True, exist_ok=True)
        for label, model in random_models().items():
            path = args.write_models / (label.replace(" ", "_").replace("#", "") + ".json")
            model.save(path)
            print(f"{path}: {model.identity_line}")
        return 0

    device, shape = "85F", None
    if args.fmax:
        fmax, source = args.fmax, "given"
    elif args.report.exists():
        report = json.loads(args.report.read_text())
        fmax, source = report["fmax_mhz"], f"{args.report} ({report['device']}, {report['identity'][13:25]}…)"
        device = report["device"]
        shape = report_shape(report)
    else:
        print(f"error: no build report at {args.report}: run python -m hdl.build --board ulx3s first, "
              "or give --fmax", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    shipped = load(args.model)
    if shape is None or args.ways:
        # The part's choice of lanes and ways; a report's other options stay.
        asked = shape or Shape()
        shape = dataclasses.replace(choose_shape(shipped, device, args.ways, attention_rows=asked.attention_rows),
                                    qkv_table=asked.qkv_table, hidden_in_lanes=asked.hidden_in_lanes)
    models = benchmark_models(shipped, "shipped " + args.model.stem)
    model_reports = [json.loads(path.read_text()) for path in args.model_report]
    prompt = [1, 2, 3]
    print(f"fmax {fmax:.2f} MHz, from {source}; {shape.lanes} lanes x {shape.ways} ways ({shape.lut_ways} in LUTs)"
          + (", the hidden vector in the lanes" if shape.hidden_in_lanes else "")
          + f", {shape.attention_rows} cache rows a cycle")
    print("C: the reference's arithmetic; C+table: q, k, v from the engine's table (where it has one); "
          f"CPU figures: the fastest of {TIMING_RUNS} runs on one core")
    header = (f"{'model':24s} {'q,k,v':>8s} {'cycles/tok':>10s} {'floor':>6s} {'fmax MHz':>9s} {'engine us':>9s} "
              f"{'engine tok/s':>12s} {'C us':>6s} {'C tok/s':>9s} {'C+table us':>10s} {'NumPy us':>8s} "
              f"{'engine/C':>8s} {'engine/C+table':>14s} {'prefill cyc':>11s} {'prefill tok/s':>13s}")
    print(header)
    series = {}
    for label, model in models.items():
        model_shape = shape.resolved(model)  # the table as the report says, else by the model's size
        cycles = measure(model, model_shape, prefix="bench")
        series[label] = cycles
        mean = sum(cycles) / len(cycles)
        # The model's own build where there is one (marked *), else the shipped model's fmax.
        model_fmax, own = fmax_for(model, model_reports, fmax)
        engine_us = mean / model_fmax
        c_us = c_ns_per_token(model, prompt) / 1000
        c_table_us = c_ns_per_token(model, prompt, qkv_table=True) / 1000 if model_shape.qkv_table else c_us
        numpy_us = golden_us_per_token(model, prompt)
        prefill = measure_prefill(model, model_shape, prefix="bench_prefill")
        prefill_mean = sum(prefill) / len(prefill)
        print(f"{label:24s} {'table' if model_shape.qkv_table else 'computed':>8s} {mean:10.1f} "
              f"{floor_cycles(model, model_shape):6.1f} {model_fmax:8.2f}{'*' if own else ' '} {engine_us:9.3f} "
              f"{1e6 / engine_us:12.0f} {c_us:6.3f} {1e6 / c_us:9.0f} {c_table_us:10.3f} {numpy_us:8.1f} "
              f"{c_us / engine_us:7.2f}x {c_table_us / engine_us:13.2f}x "
              f"{prefill_mean:11.1f} {model_fmax * 1e6 / prefill_mean:13.0f}", flush=True)
    print("* the model's own build; the other rows take the shipped model's fmax")
    plot(args.out / "cycles_per_position.png", series)
    print(f"plot: {args.out / 'cycles_per_position.png'}")

    print(f"\ncycles per token by d_model (n_heads 4, d_ff = d_model, vocab 32, seq_len 32), each with the "
          f"lanes and ways the {device}'s build chooses")
    print(f"{'d_model':>7s} {'lanes x ways (LUT)':>18s} {'q,k,v':>8s} {'pos 0':>6s} {'pos 16':>6s} {'pos 31':>6s} "
          f"{'mean':>7s} {'floor':>6s}")
    for d in (16, 32, 64):
        model = random_model(np.random.default_rng(d), d, 4, d, 32, 32)
        try:
            d_shape = choose_shape(model, device, args.ways, attention_rows=shape.attention_rows)
        except FitError:
            print(f"{d:7d}  does not fit the {device}", flush=True)
            continue
        d_shape = dataclasses.replace(d_shape, hidden_in_lanes=shape.hidden_in_lanes and model.d_ff <= d_shape.lanes)
        cycles = measure(model, d_shape, prefix="bench")
        print(f"{d:7d} {f'{d_shape.lanes} x {d_shape.ways} ({d_shape.lut_ways})':>18s} "
              f"{'table' if d_shape.qkv_table else 'computed':>8s} "
              f"{cycles[0]:6d} {cycles[16]:6d} {cycles[31]:6d} {sum(cycles) / len(cycles):7.1f} "
              f"{floor_cycles(model, d_shape):6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
