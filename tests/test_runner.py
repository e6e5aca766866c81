"""The Verilog the benches simulate: Amaranth's, lowered for Icarus (``sim.runner``)."""

import re

from amaranth import Module, Signal
from amaranth.back import verilog
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from sim.runner import _shared_values, _whole_assigns, verilog_for_icarus


class Pieces(wiring.Component):
    """Two registers, and an output made of three pieces of logic."""
    a: In(8)
    b: In(8)
    o: Out(data.StructLayout({"x": 8, "y": 4, "z": 1}))

    def elaborate(self, platform):
        m = Module()
        x, y = Signal(8), Signal(8)
        m.d.sync += [x.eq(self.a), y.eq(self.b)]
        m.d.comb += [self.o.x.eq(x + y), self.o.y.eq(y[:4] ^ x[4:]), self.o.z.eq(x[0])]
        return m


def test_the_lowering_keeps_the_logic_in_fewer_blocks_and_wires():
    amaranths = verilog.convert(Pieces(), name="pieces", emit_src=False)
    lowered = verilog_for_icarus(Pieces(), "pieces")
    # Amaranth's: a clocked block a register, the output a piece at a time, a wire a field.
    assert amaranths.count("always @(posedge clk)") == 2
    assert len(re.findall(r"assign o\[[\d:]+\] = ", amaranths)) == 3
    assert "assign \\o.x " in amaranths
    # Lowered: one clocked block with both registers, the output one concatenation, no fields.
    assert lowered.count("always @(posedge clk) begin") == 1 and lowered.count("always @(posedge") == 1
    assert len(re.findall(r"<= \\\$\d+ ;", lowered)) == 2
    assert not re.search(r"assign o\[", lowered)
    assert re.search(r"assign o = \{ \\\$signal \[0\], \\\$2 , \\\$1 \[7:0\] \};", lowered)
    assert "assign \\o." not in lowered
    # The same statements otherwise.
    statements = lambda text: sorted(line.strip() for line in text.splitlines()
                                     if "<=" in line or line.strip().startswith("assign \\$"))
    assert statements(lowered) == statements(amaranths)


def test_waves_keep_the_fields():
    assert "assign \\o.x  = o[7:0];" in verilog_for_icarus(Pieces(), "pieces", waves=True)


def test_a_wire_its_pieces_do_not_cover_stays_in_pieces():
    module = ("module m(a);\n  wire [7:0] v;\n  assign v[7:4] = a[3:0];\n  assign v[2:0] = 3'h1;\nendmodule\n")
    assert _whole_assigns(module) == module


class Sums(wiring.Component):
    """The same sums into three registers, as Amaranth writes them: an adder each time."""
    a: In(8)
    b: In(8)
    c: In(8)
    x: Out(10)
    y: Out(10)
    z: Out(9)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.x.eq(self.a + self.b + self.c), self.y.eq(self.a + self.b + self.c),
                     self.z.eq(self.a + self.b)]
        return m


def test_a_value_made_twice_is_made_once():
    amaranths = verilog.convert(Sums(), name="sums", emit_src=False)
    lowered = verilog_for_icarus(Sums(), "sums")
    assert amaranths.count("= a + b;") == 3 and amaranths.count(" + c;") == 2
    # One adder for a + b, one for its sum with c; the other results read theirs.
    assert lowered.count("= a + b;") == 1 and lowered.count(" + c;") == 1
    ab = re.search(r"assign (\\\$\d+ ) = a \+ b;", lowered)[1]
    abc = re.search(rf"assign (\\\$\d+ ) = {re.escape(ab)} \+ c;", lowered)[1]
    assert re.search(rf"assign \\\$\d+  = {re.escape(abc)};", lowered)  # y's
    assert re.search(rf"assign \\\$\d+  = {re.escape(ab)};", lowered)   # z's
    # The registers and the processes that load them are Amaranth's.
    kept = lambda text: sorted(line.strip() for line in text.splitlines() if "<=" in line or "always @*" in line)
    assert kept(lowered) == kept(amaranths)


def test_values_of_other_widths_stay_apart():
    """An operator's width is its result's: a + b in 9 bits and in 8 are different values."""
    module = ("module m(a, b);\n  wire [8:0] \\$1 ;\n  wire [7:0] \\$2 ;\n"
              "  assign \\$1  = a + b;\n  assign \\$2  = a + b;\nendmodule\n")
    assert _shared_values(module) == module


def test_a_bench_rewrites_only_its_own_asserts():
    """cocotb's default rewrites the asserts of every module a bench imports; the runner keeps
    it to the benches' own."""
    from sim.runner import run_bench
    run_bench(Pieces(), name="runner_rewrites", test_module="sim.bench_runner", params={})
