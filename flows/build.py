"""Build a bitstream for a model: python -m hdl.build --board ulx3s --model models/zen32.json

Synthesis (Yosys), place and route (nextpnr-ecp5) and packing (ecppack) are the YoWASP builds
from PyPI: no system toolchain is needed. The build writes, into --out, the bitstream and a
report (report.json and report.txt): the plan it was built from, utilisation against the
part, the clock asked of the PLL against nextpnr's fmax, cycles per token counted in
simulation, tokens per second at that clock and as a host receives them over the serial line,
and the model's identity. By default the build searches for the fastest clock at which it meets
timing (``flows.clock``); a model that does not fit the part is refused before synthesis; a
build that misses timing fails and says so. With ``--from DIR``, the model is written into the
loadable build in DIR instead, in seconds (``flows.rewrite``).
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from hdl.fanout import KEEP_REPLICAS
from int8model.bounds import BoundsError
from int8model.format import ModelError, load
from plan import FitError, LimitError, make_contents
from plan.options import add_model_argument, add_shape_arguments, plan_from_arguments
from wire import DEFAULT_BAUD
from wire.line import generation_on_the_line

from .clock import MAX_BAUD_ERROR, TARGET_CLOCK_HZ, Attempt, next_attempt
from .rewrite import RewriteError, rewrite
from .toolchain import (SYNTH_CHECK, SYNTH_OPTIONS, critical_path, fmax_of, nextpnr_options, run_toolchain,
                        utilisation)

__all__ = ["main", "text_report"]


def text_report(r):
    shape = r["plan"]["shape"]
    resources = r["plan"]["resources"]
    lines = [
        r["identity"],
        f"board ULX3S-{r['device']} ({r['part']}), {shape['lanes']} MAC lanes x {shape['ways']} ways "
        f"({shape['lut_ways']} of them in LUTs), "
        + ("q, k, v from a table, " if shape["qkv_table"] else "")
        + ("the hidden vector in the lanes, " if shape["hidden_in_lanes"] else "")
        + f"{shape['attention_rows']} cache rows a cycle, UART {r['baud']} baud",
        f"clock: asked {r['clock_hz'] / 1e6:.3f} MHz of the PLL, nextpnr fmax {r['fmax_mhz']:.2f} MHz"
        + (f" (seed {r['seed']})" if r.get("seed") is not None else " (nextpnr's own seed)") + ": "
        + ("timing met" if r["timing_met"] else "TIMING MISSED"),
        f"UART: {r['baud']} baud asked, {r['baud_actual']:.0f} made ({r['baud_error']:.2%} off, "
        f"{r['uart_divisor']} clocks a bit)",
    ]
    if len(r.get("attempts", [])) > 1:
        lines.append("attempts: " + "; ".join(
            f"{a['clock_hz'] / 1e6:.3f} MHz seed {a['seed'] if a['seed'] is not None else 'default'}: "
            f"{a['fmax_mhz']:.2f}" for a in r["attempts"]))
    if r.get("critical_path"):
        lines.append(f"critical path: {r['critical_path']['delay_ns']:.2f} ns, through "
                     + (", ".join(r["critical_path"]["sources"]) or "no line of the design"))
    lines.append("utilisation (the plan's count in brackets):")
    planned = {"DP16KD": resources["DP16KD"], "MULT18X18D": resources["MULT18X18D"]}
    for name, u in r["utilisation"].items():
        plan_note = f"  [{planned[name]}]" if name in planned else ""
        lines.append(f"  {name:11s} {u['used']:6d} / {u['available']:6d}  "
                     f"({100 * u['used'] / max(1, u['available']):.1f}%){plan_note}")
    lines.append("  (LUT4 as nextpnr counts logic cells: LUT4s, carry chains and LUT RAM together)")
    c = r["cycles_per_token"]
    lines += [
        f"cycles per token (simulated): position 0: {c['first']}, mean over {c['positions']} positions: "
        f"{c['mean']:.1f}, last: {c['last']}; MAC-bound floor {resources['floor_cycles']:.1f}",
        f"tokens per second at {r['clock_hz'] / 1e6:.3f} MHz: {r['tokens_per_second']:.0f} "
        f"({1e6 / r['tokens_per_second']:.2f} us per token); at fmax: {r['tokens_per_second_at_fmax']:.0f}",
        f"as a host receives them at {r['baud']} baud: {r['host']['tokens_per_second']:.0f} tokens/s "
        f"({r['host']['line_bytes_per_token']:.2f} bytes a token on the line, framing included, "
        f"generating {r['host']['count']} tokens after a {r['host']['prompt']}-token prompt)",
        f"bitstream: {r['bitstream']}",
        f"build time: {r['build_seconds']:.0f} s",
    ]
    limits, boot = r["plan"].get("limits"), r.get("boot")
    if limits:
        image = r["plan"]["boot_depth"]
        lines.append("loadable: any model of its shape within its limits, over the line (host.generate --load); "
                     + (f"a boot image of {image} bytes" if image else "no boot image (no block RAM left for one)"))
    if boot:
        lines.append(f"boot image: {r['model_sha256'][:16]}'s load, {boot['frames_bytes']} bytes of frames, written "
                     f"into {boot['from']}'s bitstream in {boot['rewrite_seconds']:.1f} s: it runs at power-up")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hdl.build", description=__doc__.splitlines()[0])
    parser.add_argument("--board", choices=["ulx3s"], required=True, help="the board to build for (required)")
    add_model_argument(parser)
    add_shape_arguments(parser)
    parser.add_argument("--clock", type=float, metavar="HZ",
                        help="build once at this engine clock (default: the fastest clock, at or below "
                             f"{TARGET_CLOCK_HZ / 1e6:.0f} MHz, at which the build meets timing)")
    parser.add_argument("--attempts", type=int, default=4,
                        help="place-and-route runs the clock search may take (default: %(default)s)")
    parser.add_argument("--baud", type=int, default=DEFAULT_BAUD, help="UART baud (default: %(default)s)")
    parser.add_argument("--seed", type=int,
                        help="nextpnr's placement seed of the first run: fmax varies by a few MHz from seed "
                             "to seed (default: nextpnr's own)")
    parser.add_argument("--out", type=Path, default=Path("build/ulx3s"),
                        help="where the bitstream and the report go (default: %(default)s)")
    parser.add_argument("--program", action="store_true",
                        help="load the bitstream with openFPGALoader (default: only build)")
    parser.add_argument("--from", dest="source", type=Path, metavar="DIR",
                        help="write --model into the loadable build in DIR (its --out) instead of building: its "
                             "bitstream, powering up with the model, in seconds; the shape is DIR's "
                             "(default: build)")
    args = parser.parse_args(argv)
    if args.source is not None:
        return rewrite_main(args)

    from boards.ulx3s import PLATFORMS, ULX3STop, pll_parameters
    from hdl.uart import divisor_for
    from sim.cycles import measure

    try:
        model = load(args.model)
        print(model.identity_line)
        plan = plan_from_arguments(model, args)
        contents = None if plan.loadable else make_contents(plan, model)
        if args.clock is not None:
            clock_hz = pll_parameters(args.clock)[3]
            error = divisor_for(clock_hz, args.baud)[1]
            if error > MAX_BAUD_ERROR:
                raise ValueError(f"at {clock_hz / 1e6:.3f} MHz (the PLL's nearest to {args.clock / 1e6:.3f}) the "
                                 f"UART makes {args.baud} baud {error:.2%} off (at most {MAX_BAUD_ERROR:.0%})")
            attempt = Attempt(clock_hz, args.seed)
        else:
            attempt = next_attempt([], baud=args.baud)
            attempt = Attempt(attempt.clock_hz, args.seed)
    except (ModelError, BoundsError, FitError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tried, build_seconds = [], 0.0
    while attempt is not None:
        top = ULX3STop(plan, contents, clock_hz=attempt.clock_hz, baud=args.baud)
        attempt = Attempt(top.clock_hz, attempt.seed)
        seed = "nextpnr's own" if attempt.seed is None else attempt.seed
        print(f"place and route {len(tried) + 1}: {top.clock_hz / 1e6:.3f} MHz asked of the PLL, seed {seed}",
              file=sys.stderr)
        platform = PLATFORMS[args.device]()  # a platform prepares one design
        fmax, report, seconds = place_and_route(platform, top, plan, attempt.seed, out)
        if fmax is None:
            return 1
        tried.append(Attempt(attempt.clock_hz, attempt.seed, fmax))
        print(f"  fmax {fmax:.2f} MHz: " + ("timing met" if tried[-1].met else "timing missed"), file=sys.stderr)
        build_seconds += seconds
        if args.clock is not None:
            break
        attempt = next_attempt(tried, baud=args.baud, attempts=args.attempts)
    final = tried[-1]  # the bitstream on disk is the last run's

    cycles = measure(model, plan, prefix="build_cycles", progress="counting cycles per token in simulation")
    mean = sum(cycles) / len(cycles)
    build_dir = out / "gateware"
    shutil.copy(build_dir / "top.bit", out / "top.bit")
    clock_hz = top.clock_hz
    # A one-token prompt, then a GENERATE to the end of the context.
    line_cycles, line_bytes = generation_on_the_line(cycles[1:], top.device.divisor)
    count = len(cycles)
    result = {
        "identity": model.identity_line, "model_sha256": model.sha256, "model_file": str(args.model),
        "board": "ulx3s", "device": args.device, "part": platform.device, "plan": plan.to_json(),
        "seed": final.seed, "baud": top.device.baud, "uart_divisor": top.device.divisor,
        "baud_actual": clock_hz / top.device.divisor, "baud_error": top.device.baud_error,
        "clock_hz": clock_hz, "fmax_mhz": final.fmax_mhz, "timing_met": final.met,
        "attempts": [{"clock_hz": a.clock_hz, "seed": a.seed, "fmax_mhz": a.fmax_mhz} for a in tried],
        "critical_path": critical_path(report), "utilisation": utilisation(report),
        "cycles_per_token": {"first": cycles[0], "last": cycles[-1], "mean": mean,
                             "positions": len(cycles), "per_position": cycles},
        "tokens_per_second": clock_hz / mean, "tokens_per_second_at_fmax": final.fmax_mhz * 1e6 / mean,
        "host": {"prompt": 1, "count": count, "tokens_per_second": count * clock_hz / line_cycles,
                 "line_bytes_per_token": line_bytes / count},
        "bitstream": str(out / "top.bit"), "build_seconds": build_seconds,
    }
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    text = text_report(result)
    (out / "report.txt").write_text(text)
    print(text, end="")
    if not final.met:
        print(f"error: timing missed: {final.fmax_mhz:.2f} MHz < {clock_hz / 1e6:.3f} MHz asked"
              + ("; lower --clock" if args.clock is not None else f" after {len(tried)} runs; give --clock"),
              file=sys.stderr)
        return 1
    return program(out) if args.program else 0


def rewrite_main(args):
    """``--from``: the model into an existing loadable build's bitstream, with a new report."""
    try:
        model = load(args.model)
        print(model.identity_line)
        if not (args.source / "report.json").exists():
            raise RewriteError(f"{args.source} holds no build (no report.json): build it with --loadable first")
        out = args.out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        result = rewrite(args.source.resolve(), model, out, args.model)
    except (ModelError, BoundsError, LimitError, RewriteError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    text = text_report(result)
    (out / "report.txt").write_text(text)
    print(text, end="")
    return program(out) if args.program else 0


def program(out):
    if not shutil.which("openFPGALoader"):
        print("error: openFPGALoader is not installed (apt install openfpgaloader)", file=sys.stderr)
        return 1
    subprocess.run(["openFPGALoader", "--board", "ulx3s", str(out / "top.bit")], check=True)
    return 0


def place_and_route(platform, top, plan, seed, out):
    """Synthesise, place, route and pack ``top`` into ``out/gateware``: nextpnr's fmax (MHz),
    its report, and the seconds taken; the fmax is ``None`` if the toolchain failed."""
    build_dir = out / "gateware"
    if build_dir.exists():
        shutil.rmtree(build_dir)
    print(f"elaborating for the ULX3S-{platform.device} at {top.clock_hz / 1e6:.3f} MHz, {plan.shape.describe()}; "
          f"the plan: {plan.dsp_blocks} MULT18X18D, {plan.block_rams} DP16KD", file=sys.stderr)
    build = platform.build(top, name="top", do_build=False, synth_opts=SYNTH_OPTIONS,
                           script_after_read=KEEP_REPLICAS, script_after_synth=SYNTH_CHECK,
                           nextpnr_opts=nextpnr_options(seed))
    build.extract(build_dir)
    code, seconds = run_toolchain(build_dir, f"{build.script}.sh", out / "toolchain.log")
    if code != 0 or not (build_dir / "top.bit").exists():
        print(f"error: the toolchain failed (exit {code}); see {out / 'toolchain.log'}", file=sys.stderr)
        return None, None, seconds
    report = json.loads((build_dir / "report.json").read_text())
    return fmax_of(report), report, seconds


if __name__ == "__main__":
    sys.exit(main())
