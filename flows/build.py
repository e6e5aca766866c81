"""Build a bitstream for a model: python -m hdl.build --board ulx3s --model models/zen32.json

Synthesis (Yosys), place and route (nextpnr-ecp5) and packing (ecppack) are the YoWASP builds
from PyPI: no system toolchain is needed. The build writes, into --out, the bitstream and a
report (report.json and report.txt): the plan it was built from, utilisation against the
part, the clock asked for against nextpnr's fmax, cycles per token counted in simulation,
tokens per second, and the model's identity. A model that does not fit the part is refused
before synthesis; a build that misses timing fails and says so.
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
from plan import FitError, make_contents
from plan.options import add_model_argument, add_shape_arguments, plan_from_arguments
from wire import DEFAULT_BAUD

from .toolchain import (SYNTH_CHECK, SYNTH_OPTIONS, critical_path, fmax_of, nextpnr_options, run_toolchain,
                        utilisation)

__all__ = ["DEFAULT_CLOCK_HZ", "main", "text_report"]

# 3 Mbaud is 20 clocks a bit. Below nextpnr's fmax on the 45F and the 85F at every seed built,
# with a margin for a placement that does worse.
DEFAULT_CLOCK_HZ = 60_000_000


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
        f"clock: asked {r['clock_hz'] / 1e6:.2f} MHz, nextpnr fmax {r['fmax_mhz']:.2f} MHz"
        + (f" (seed {r['seed']})" if r.get("seed") is not None else "") + ": "
        + ("timing met" if r["timing_met"] else "TIMING MISSED"),
    ]
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
        f"tokens per second at {r['clock_hz'] / 1e6:.2f} MHz: {r['tokens_per_second']:.0f} "
        f"({1e6 / r['tokens_per_second']:.2f} us per token); at fmax: {r['tokens_per_second_at_fmax']:.0f}",
        f"bitstream: {r['bitstream']}",
        f"build time: {r['build_seconds']:.0f} s",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hdl.build", description=__doc__.splitlines()[0])
    parser.add_argument("--board", choices=["ulx3s"], required=True, help="the board to build for (required)")
    add_model_argument(parser)
    add_shape_arguments(parser)
    parser.add_argument("--clock", type=float, default=DEFAULT_CLOCK_HZ, metavar="HZ",
                        help="engine clock made by the PLL (default: %(default).0f)")
    parser.add_argument("--baud", type=int, default=DEFAULT_BAUD, help="UART baud (default: %(default)s)")
    parser.add_argument("--seed", type=int,
                        help="nextpnr's placement seed: fmax varies by a few MHz from seed to seed "
                             "(default: nextpnr's own)")
    parser.add_argument("--out", type=Path, default=Path("build/ulx3s"),
                        help="where the bitstream and the report go (default: %(default)s)")
    parser.add_argument("--program", action="store_true",
                        help="load the bitstream with openFPGALoader (default: only build)")
    args = parser.parse_args(argv)

    from boards.ulx3s import PLATFORMS, ULX3STop
    from sim.cycles import measure

    try:
        model = load(args.model)
        print(model.identity_line)
        plan = plan_from_arguments(model, args)
        top = ULX3STop(plan, make_contents(plan, model), clock_hz=args.clock, baud=args.baud)
    except (ModelError, BoundsError, FitError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    platform = PLATFORMS[args.device]()
    out = args.out.resolve()
    build_dir = out / "gateware"
    if build_dir.exists():
        shutil.rmtree(build_dir)
    print(f"elaborating for the ULX3S-{args.device} at {top.clock_hz / 1e6:.2f} MHz, {plan.shape.describe()}; "
          f"the plan: {plan.dsp_blocks} MULT18X18D, {plan.block_rams} DP16KD", file=sys.stderr)
    build = platform.build(top, name="top", do_build=False, synth_opts=SYNTH_OPTIONS,
                           script_after_read=KEEP_REPLICAS, script_after_synth=SYNTH_CHECK,
                           nextpnr_opts=nextpnr_options(args.seed))
    build.extract(build_dir)
    code, seconds = run_toolchain(build_dir, f"{build.script}.sh", out / "toolchain.log")
    if code != 0 or not (build_dir / "top.bit").exists():
        print(f"error: the toolchain failed (exit {code}); see {out / 'toolchain.log'}", file=sys.stderr)
        return 1

    report = json.loads((build_dir / "report.json").read_text())
    fmax = fmax_of(report)
    print("counting cycles per token in simulation", file=sys.stderr)
    cycles = measure(model, plan, prefix="build_cycles")
    mean = sum(cycles) / len(cycles)
    shutil.copy(build_dir / "top.bit", out / "top.bit")
    result = {
        "identity": model.identity_line, "model_sha256": model.sha256, "model_file": str(args.model),
        "board": "ulx3s", "device": args.device, "part": platform.device, "plan": plan.to_json(),
        "seed": args.seed, "baud": top.device.baud, "clock_hz": top.clock_hz, "fmax_mhz": fmax,
        "timing_met": fmax * 1e6 >= top.clock_hz, "critical_path": critical_path(report),
        "utilisation": utilisation(report),
        "cycles_per_token": {"first": cycles[0], "last": cycles[-1], "mean": mean,
                             "positions": len(cycles), "per_position": cycles},
        "tokens_per_second": top.clock_hz / mean, "tokens_per_second_at_fmax": fmax * 1e6 / mean,
        "bitstream": str(out / "top.bit"), "build_seconds": seconds,
    }
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    text = text_report(result)
    (out / "report.txt").write_text(text)
    print(text, end="")
    if not result["timing_met"]:
        print(f"error: timing missed: {fmax:.2f} MHz < {top.clock_hz / 1e6:.2f} MHz asked; "
              f"lower --clock", file=sys.stderr)
        return 1
    if args.program:
        if not shutil.which("openFPGALoader"):
            print("error: openFPGALoader is not installed (apt install openfpgaloader)", file=sys.stderr)
            return 1
        subprocess.run(["openFPGALoader", "--board", "ulx3s", str(out / "top.bit")], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
