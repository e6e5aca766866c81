"""The deep models' rows of the benchmark: the deep demo and random models of 1, 2 and 4 layers
at d_model 64, their engine beside one CPU core.

For each: cycles per token counted in simulation over a whole context, the words the lanes issue
in a step (the cycles they are busy; docs/cycles.md), the MAC-bound floor and
the engine's ratio to it, tokens per second at the clock the deep demo's bitstream runs at (and
at its fmax), and the C decoder on one core. The fmax, the clock and the utilisation are the
deep demo's 85F build's (its report); the random models, of the demo's shape, take them too.
"""

import json
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from int8model import load
from int8model.synthetic import random_model
from plan import choose_plan

from .timing import c_ns_per_token

__all__ = ["deep_models", "deep_table"]

RANDOM_LAYERS = (1, 2, 4)


def deep_models(demo):
    """The models of the table, by label: the demo, then random ones of its d_model, heads, d_ff,
    vocab and context, 1, 2 and 4 layers deep."""
    models = {f"deep demo {demo.n_layers} layers": demo}
    for layers in RANDOM_LAYERS:
        models[f"random d64 {layers} layer{'s' if layers > 1 else ''}"] = random_model(
            np.random.default_rng(64 + layers), demo.d_model, demo.n_heads, demo.d_ff, demo.vocab, demo.seq_len,
            n_layers=layers)
    return models


def deep_table(demo_path, report, device, measure, prompt=(1, 2, 3), jobs=None):
    """Print the deep models' table: ``report`` the demo's build report (``None``: no fmax or
    clock to multiply by), ``measure(model, plan, progress=label)`` the cycles of every position
    (a function a process pool can run, ``jobs`` of them at once: every core by default; each
    shows its steps done under its label). The simulations all end before the C decoder is timed,
    so that none shares its core."""
    demo = load(demo_path)
    models = deep_models(demo)
    plans = {label: choose_plan(model, device) for label, model in models.items()}
    print(f"\nsimulating the deep models over their whole context, {jobs or os.cpu_count()} at a time "
          f"(tens of minutes)", flush=True)
    counted = {}
    demo_label = next(iter(models))
    if report and report["model_sha256"] == demo.sha256 \
            and report["plan"] == json.loads(json.dumps(plans[demo_label].to_json())):
        # The build counted the demo's cycles on the same plan: no need to count them again.
        counted[demo_label] = report["cycles_per_token"]["per_position"]
        print("the deep demo's cycles: as its build counted them in simulation, on the same plan")
    with ProcessPoolExecutor(jobs or os.cpu_count()) as pool:
        futures = {label: pool.submit(measure, models[label], plans[label], progress=label)
                   for label in models if label not in counted}
        counted.update({label: future.result() for label, future in futures.items()})
    print(f"\ndeep models, as the {device}'s build shapes each (the clock and fmax: "
          + (f"the deep demo's build, {report['clock_hz'] / 1e6:.2f} MHz asked, fmax {report['fmax_mhz']:.2f} MHz)"
             if report else "none given: cycles only)"))
    if report:
        used = ", ".join(f"{name} {u['used']:,}/{u['available']:,}" for name, u in report["utilisation"].items()
                         if name in ("LUT4", "FF", "DP16KD", "MULT18X18D"))
        print(f"utilisation of the deep demo's build: {used}")
    print(f"{'model':26s} {'shape':>16s} {'cycles/tok':>10s} {'lanes':>6s} {'floor':>6s} {'ratio':>6s} {'tok/s@clock':>11s} "
          f"{'tok/s@fmax':>10s} {'C us':>7s} {'C tok/s':>8s} {'engine/C':>8s}")
    for label, model in models.items():
        plan, cycles = plans[label], counted[label]
        mean = sum(cycles) / len(cycles)
        # A deep model's context takes tens of microseconds a token: fewer repetitions a run.
        c_us = c_ns_per_token(model, list(prompt), repetitions=20) / 1000
        shape = plan.shape
        at_clock = report["clock_hz"] / mean if report else None
        at_fmax = report["fmax_mhz"] * 1e6 / mean if report else None
        print(f"{label:26s} {f'{shape.lanes}x{shape.ways} ({shape.lut_ways} LUT)':>16s} {mean:10.1f} "
              f"{plan.lane_words:6d} {plan.floor_cycles:6.1f} {mean / plan.floor_cycles:5.2f}x "
              + (f"{at_clock:11.0f} {at_fmax:10.0f} " if report else f"{'-':>11s} {'-':>10s} ")
              + f"{c_us:7.2f} {1e6 / c_us:8.0f} " + (f"{at_clock * c_us / 1e6:7.2f}x" if report else f"{'-':>8s}"),
              flush=True)
