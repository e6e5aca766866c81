"""Run a cocotb bench on the Verilog of an Amaranth component, under Icarus Verilog.

Each bench gets a build directory of its own (under ``build/cocotb/``), holding the generated
Verilog and the parameters the bench reads back (``BENCH_PARAMS``).
"""

import json
import os
from pathlib import Path

from amaranth.back import verilog
from cocotb_tools.runner import get_runner

__all__ = ["BUILD_ROOT", "run_bench", "bench_params"]

BUILD_ROOT = Path(__file__).resolve().parent.parent / "build" / "cocotb"


def run_bench(component, *, name, test_module, params, testcase=None):
    """Convert ``component`` to Verilog as module ``name`` and run ``test_module`` against it."""
    build_dir = BUILD_ROOT / name
    build_dir.mkdir(parents=True, exist_ok=True)
    source = build_dir / f"{name}.v"
    source.write_text(verilog.convert(component, name=name, emit_src=False))
    params_file = build_dir / "params.json"
    params_file.write_text(json.dumps(params))
    runner = get_runner("icarus")
    runner.build(sources=[source], hdl_toplevel=name, build_dir=build_dir,
                 timescale=("1ns", "1ps"), always=True)
    runner.test(test_module=test_module, hdl_toplevel=name, build_dir=build_dir,
                testcase=testcase, extra_env={"BENCH_PARAMS": str(params_file)},
                timescale=("1ns", "1ps"),
                waves=bool(os.environ.get("WAVES")))


def bench_params():
    """Inside a bench: the parameters its launcher wrote."""
    return json.loads(Path(os.environ["BENCH_PARAMS"]).read_text())
