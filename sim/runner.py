"""Run a cocotb bench on the Verilog of an Amaranth component, under Icarus Verilog.

Each bench gets a build directory of its own (under ``build/cocotb/``), holding the generated
Verilog and the parameters the bench reads back (``BENCH_PARAMS``).
"""

import collections
import json
import os
import re
from pathlib import Path

from amaranth.back import verilog
from cocotb_tools.check_results import get_results
from cocotb_tools.runner import get_runner

__all__ = ["BUILD_ROOT", "ECP5Cells", "run_bench", "generated_verilog", "bench_params"]

BUILD_ROOT = Path(__file__).resolve().parent.parent / "build" / "cocotb"


class ECP5Cells:
    """A platform to elaborate a unit as for an ECP5, with the ECP5 primitives it instantiates
    itself (multipliers with their own registers, global buffers), which ``models/ecp5_cells.v``
    simulates: ``run_bench(..., platform=ECP5Cells())``."""
    family = "ecp5"
    models = [Path(__file__).resolve().parent / "models" / "ecp5_cells.v"]


# Yosys makes each `always @*` block sensitive to a register declared `= 0`, expecting that to
# wake the block at time zero; Icarus Verilog raises no event for a declaration's initialiser,
# so a block whose inputs never change would never run. An explicit toggle wakes them all.
_WAKE = re.compile(r"reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+) += 0;")


# Yosys writes each register's update as an `always` block of its own. Icarus wakes every such
# block on every clock edge, so the engine's two thousand of them cost more than half of an idle
# cycle; one block per module and clock does the same (each is one non-blocking assignment).
_CLOCKED = re.compile(r"  always @\(posedge (\w+)\)\n    ([^\n]*<=[^\n]*;)\n")

# A field of a `data.View` gets a wire of its own, a slice of the signal, for the waveforms only:
# no logic reads it, but Icarus updates it with every change of the signal.
_FIELD_ALIAS = re.compile(r"^  assign \\[^ ]*[.\[][^ ]* += \\?[^ ]+ ?\[[0-9:]+\];\n", re.M)


# Yosys drives a wide wire made of pieces with one `assign` a piece. Icarus resolves such a wire
# bit by bit, as if the pieces were drivers of different strengths, on every change of any of
# them; one `assign` of the pieces' concatenation is a plain copy. The engine's wide stream
# payloads (a thousand bits and more) made this a third of a step's simulation.
_PIECE = re.compile(r"^  assign (\\[^ \n]+ |[A-Za-z_][\w$]*)\[(\d+)(?::(\d+))?\] = ([^;\n]+);\n", re.M)
_VECTOR = re.compile(r"^  (?:wire|output) (?:signed )?\[(\d+):0\] (\\?[^ ;]+) ?;$", re.M)


def _gathered(module, pattern, key, combine):
    """``module`` with the lines ``pattern`` matches gathered by ``key``: a group's first line
    becomes ``combine(key, matches)`` and its others go; a group ``combine`` refuses (``None``)
    stays as it was."""
    groups = {}
    for match in pattern.finditer(module):
        groups.setdefault(key(match), []).append(match)
    combined = {name: combine(name, matches) for name, matches in groups.items()}
    written = set()

    def replace(match):
        name = key(match)
        if combined[name] is None:
            return match[0]
        if name in written:
            return ""
        written.add(name)
        return combined[name]
    return pattern.sub(replace, module)


def _whole_wire(name, matches, widths):
    parts = sorted(((int(m[2]), int(m[3] or m[2]), m[4]) for m in matches), reverse=True)
    # Only a wire its pieces cover exactly, each from the bit below the one above it.
    tops = [widths.get(name, 0) - 1] + [low - 1 for _, low, _ in parts]
    if [high for high, _, _ in parts] + [-1] != tops:
        return None
    space = " " if name.startswith("\\") else ""
    return f"  assign {name}{space} = {{ {', '.join(value for _, _, value in parts)} }};\n"


def _whole_assigns(module):
    widths = {match[2]: int(match[1]) + 1 for match in _VECTOR.finditer(module)}
    return _gathered(module, _PIECE, lambda match: match[1].strip(),
                     lambda name, matches: _whole_wire(name, matches, widths))


# Yosys names each operator's result (`\$123`) and writes it as an `assign`; where the same
# expression is made for several registers (a lane's sum, for each register it loads), each
# copy is an operator of its own. Icarus evaluates every one on every change of its inputs.
_TEMP_ASSIGN = re.compile(r"^  assign (\\\$[^ \n]+)  = ([^;\n]+);\n", re.M)
_TEMP_WIRE = re.compile(r"^  wire ((?:signed )?(?:\[\d+:\d+\] )?)(\\\$[^ \n]+) ;\n", re.M)
_TEMP = re.compile(r"\\\$[^ \n]+ ")


def _shared_values(module):
    """``module`` with each result computed once: an operator's result that another of the same
    type computes from the same operands (found bottom up, so whole trees) is read from it."""
    types = {match[2]: match[1] for match in _TEMP_WIRE.finditer(module)}
    values = {match[1]: match[2] for match in _TEMP_ASSIGN.finditer(module) if match[1] in types}
    same = {}  # result → one computed the same way before it

    def computed(name):  # where ``name`` is computed
        while name in same:
            name = same[name]
        return name

    def operands_shared(value):
        return _TEMP.sub(lambda name: computed(name[0][:-1]) + " ", value)
    while True:
        first, found = {}, False
        for name, value in values.items():
            # The type (width and sign) too: an operator's width is its result's.
            key = (types[name], operands_shared(value))
            if name not in same and first.setdefault(key, name) != name:
                same[name], found = first[key], True
        if not found:
            break
    if not same:
        return module
    module = _TEMP_ASSIGN.sub(lambda match: f"  assign {match[1]}  = "
                              f"{computed(match[1]) + ' ' if match[1] in same else operands_shared(match[2])};\n"
                              if match[1] in values else match[0], module)
    # A shared result that nothing else reads goes, wire and all.
    readers = collections.Counter(name[0][:-1] for name in _TEMP.finditer(module))
    unread = {name for name in same if readers[name] == 2}  # its wire and its assign
    return _TEMP_WIRE.sub(lambda match: "" if match[2] in unread else match[0],
                          _TEMP_ASSIGN.sub(lambda match: "" if match[1] in unread else match[0], module))


def _one_clocked_block(module):
    return _gathered(module, _CLOCKED, lambda match: match[1],
                     lambda clock, matches: f"  always @(posedge {clock}) begin\n"
                                            + "".join(f"    {match[2]}\n" for match in matches) + "  end\n")


def verilog_for_icarus(component, name, platform=None, waves=False):
    """``component`` as Verilog that Icarus simulates fast: the same logic as Amaranth's, its
    registers' updates one block per clock, its wide wires each one assignment; without
    ``waves``, no fields' wires."""
    text = verilog.convert(component, name=name, platform=platform, emit_src=False)
    text = _WAKE.sub(lambda m: f"reg {m[1]} = 0;\n  initial #1 {m[1]} = 1;", text)
    text = "".join(_shared_values(_whole_assigns(_one_clocked_block(module)))
                   for module in re.split(r"(?<=endmodule\n)", text))
    return text if waves else _FIELD_ALIAS.sub("", text)


# cocotb's default (``*.py``) rewrites the asserts of every module a bench imports, NumPy's
# and Amaranth's too, which triples the bench's imports (docs/verification.md). The benches'
# own are still rewritten, so that a failure shows its values.
REWRITTEN = "sim/*.py"


def run_bench(component, *, name, test_module, params, testcase=None, build_dir=None, log_file=None,
              platform=None):
    """Convert ``component`` to Verilog as module ``name`` (elaborated for ``platform``, with its
    primitives' ``models`` where it has them) and run ``test_module`` against it."""
    build_dir = Path(build_dir) if build_dir else BUILD_ROOT / name
    build_dir.mkdir(parents=True, exist_ok=True)
    source = build_dir / f"{name}.v"
    waves = bool(os.environ.get("WAVES"))
    source.write_text(verilog_for_icarus(component, name, platform, waves))
    params_file = build_dir / "params.json"
    params_file.write_text(json.dumps(params))
    runner = get_runner("icarus")
    runner.build(sources=[source, *getattr(platform, "models", [])], hdl_toplevel=name, build_dir=build_dir,
                 timescale=("1ns", "1ps"), always=True)
    results = runner.test(test_module=test_module, hdl_toplevel=name, build_dir=build_dir,
                          testcase=testcase, extra_env={"BENCH_PARAMS": str(params_file),
                                                        "COCOTB_REWRITE_ASSERTION_FILES": REWRITTEN},
                          timescale=("1ns", "1ps"), log_file=log_file,
                          waves=waves)
    # Under pytest the runner itself fails the test; elsewhere (benchmarks) check here.
    tests, failed = get_results(Path(results))
    if failed or not tests:
        raise RuntimeError(f"{failed} of {tests} cocotb tests failed in {build_dir}")


def generated_verilog(name):
    """The Verilog that ``run_bench`` generated for the bench ``name``."""
    return (BUILD_ROOT / name / f"{name}.v").read_text()


def bench_params():
    """Inside a bench: the parameters its launcher wrote."""
    return json.loads(Path(os.environ["BENCH_PARAMS"]).read_text())
