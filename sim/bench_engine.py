"""Bench: whole generations on the engine, every token against the golden model.

An observer watches the streams between the units, so that on a mismatch the bench names the
first intermediate of the first step that differs, not just the wrong token. The launcher
(:func:`run_engine`) and the bench make the engine the same way, from the model and the shape
it is given once: the plan (:func:`engine_of`).
"""

import contextlib
import dataclasses
import json
import random
from pathlib import Path

import cocotb
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge

from hdl.engine import Engine
from hdl.interface import Error, Op
from int8model.format import from_json
from int8model.golden import Golden
from plan import Shape, limits_for, make_contents, make_loadable_plan, make_plan
from plan.loading import load_images
from plan.schedule import Stage

from .bench import cycle_now, start
from .payload import unpack
from .progress import shown_progress
from .runner import BUILD_ROOT, bench_params, run_bench
from .streams import StreamSink, StreamSource

LAYER_NAMES = ("xi", "q", "k", "v", "ci", "hi", "fi")  # a layer's intermediates the bench watches
TOP_NAMES = ("oi", "logits")                          # the head's (layer None)


def stream_names(plan):
    """For each of the epilogue's selects, the name and layer (``None``: the head's) of what it
    makes: a layer below the last's F stage makes the next layer's xi."""
    names = {}
    for stage in plan.all_stages:
        name, layer = stage.step.output, stage.layer
        if stage.stage == Stage.F:
            name, layer = ("xi", layer + 1) if layer < plan.model.n_layers - 1 else ("oi", None)
        names[stage.select] = (name, layer)
    return names


def engine_of(model, shape, loadable=False):
    """The engine of ``model`` in ``shape``, as a build would make it (its plan, its contents);
    ``loadable``: a loadable build for the model's shape (:func:`plan.limits_for`), empty."""
    if loadable:
        return Engine(make_loadable_plan(limits_for(model), shape))
    plan = make_plan(model, shape)
    return Engine(plan, make_contents(plan, model))


def run_engine(model, shape, prompts, *, name=None, prefix="engine", seed=0, testcase="generations_match_golden",
               platform=None, report=False, quiet=False, loadable=False, progress=None):
    """Run the bench on ``model``'s engine in ``shape``: each prompt generated to the end of the
    context (``generations_match_golden``), or ``testcase``; ``loadable``: a loadable build's
    engine, the model written into it through its ``load`` port first. Returns the bench's name
    and, with ``report``, the file of the cycles it counted. A bench directory of its own for
    each model and shape (every field of it): runs of different ones never share their
    generated Verilog. ``progress``: what the run is called in the lines that show, on stderr,
    how many of its steps are done (:func:`sim.progress.shown_progress`)."""
    shape = dataclasses.replace(shape, qkv_table=False) if loadable else shape
    shape = shape.resolved(model)
    name = name or "_".join([prefix, model.sha256[:12], *(str(int(value)) for value in dataclasses.astuple(shape))]
                            + (["loadable"] if loadable else []))
    report_file = BUILD_ROOT / name / "cycles.json" if report else None
    steps_file = BUILD_ROOT / name / "steps_done"
    params = {"model": model.to_json(), "shape": dataclasses.asdict(shape), "prompts": prompts, "seed": seed,
              "report": str(report_file) if report else None, "loadable": loadable,
              "steps_file": str(steps_file) if progress else None}
    engine = engine_of(model, shape, loadable)
    steps_file.unlink(missing_ok=True)
    steps = model.seq_len * len(prompts)  # a generation to the end of the context: a step a position

    def status():
        return progress, f"{steps_file.read_text() if steps_file.exists() else 0} / {steps} steps"
    with shown_progress(status) if progress else contextlib.nullcontext():
        run_bench(engine, name=name, test_module="sim.bench_engine", params=params, testcase=testcase,
                  platform=platform, log_file=BUILD_ROOT / name / "simulation.log" if quiet else None)
    return name, report_file


class Observer:
    """Records, step by step, what flows out of the epilogue, the attention unit and the head."""

    def __init__(self, dut, engine):
        self.dut, self.engine = dut, engine
        self.steps = []
        self.by_position = {}  # what is recorded by position rather than by step: {pos: {name: values}}
        self.timelines = []  # per step: {(name, layer): [first cycle, last cycle]}

    def new_step(self):
        layers = self.engine.plan.model.n_layers
        self.steps.append({**{(name, layer): [] for layer in range(layers) for name in LAYER_NAMES},
                           **{(name, None): [] for name in TOP_NAMES}})
        self.timelines.append({})

    def _seen(self, key):
        cycle = cycle_now()
        self.timelines[-1].setdefault(key, [cycle, cycle])[1] = cycle

    async def run(self):
        dut, engine, plan = self.dut, self.engine, self.engine.plan
        epilogue = engine.epilogues[0].o.payload.shape()
        scratch = plan.epilogue.scratch
        def probe(name):  # the engine's named copies of a unit's output stream
            return tuple(getattr(dut, f"probe_{name}_{field}") for field in ("valid", "ready", "payload"))
        epilogues = [probe(f"epilogue{k}") for k in range(plan.shape.ways)]
        attention_o, head_o = probe("attention"), probe("head")
        query, cache_write = probe("query"), probe("cache_write")
        attention = engine.attention.o.payload.shape()
        head = engine.matvec.w.payload.shape()
        hidden = engine.matvec.hidden_vector.shape() if plan.lanes.hidden is not None else None
        query_layout = engine.attention.i.payload.shape()
        row_layout = engine.cache.write.payload.shape()
        names = stream_names(plan)
        while True:
            await RisingEdge(dut.clk)
            await ReadOnly()
            if not self.steps:
                continue
            step = self.steps[-1]
            for valid, ready, payload in epilogues:  # in step: element k of a word is epilogue k's
                if int(valid.value) and int(ready.value):
                    out = unpack(epilogue, int(payload.value))
                    if out["tag"] != scratch:
                        step[names[out["select"]]].append(out["value"])
                        self._seen(names[out["select"]])
            if plan.qkv.table:
                # q, k and v come from the table, not the epilogue: as attention takes q, and
                # as the cache takes the row (the last write of a step holds both K and V).
                # By position: a step's first cycles may pass before the bench starts its record.
                valid, ready, payload = query
                if int(valid.value) and int(ready.value):
                    query_in = unpack(query_layout, int(payload.value))
                    self.by_position.setdefault(query_in["pos"], {})[("q", 0)] = query_in["q"]
                valid, ready, payload = cache_write
                if int(valid.value) and int(ready.value):
                    row = unpack(row_layout, int(payload.value))
                    self.by_position.setdefault(row["pos"], {}).update({("k", 0): row["k"], ("v", 0): row["v"]})
            valid, ready, payload = attention_o
            if int(valid.value) and int(ready.value):
                out = unpack(attention, int(payload.value))
                step[("ci", out.get("layer", 0))] += out["values"][:out["count"]]
                self._seen(("ci", out.get("layer", 0)))
            valid, ready, payload = head_o
            if int(valid.value) and int(ready.value):
                out = unpack(head, int(payload.value))
                step[("logits", None)] += out["values"][:out["count"]]
                self._seen(("logits", None))
            if hidden is not None and int(dut.probe_hidden_valid.value):
                # The hidden vector never leaves the lanes: as it is made, lane l's element l.
                step[("fi", 0)] += unpack(hidden, int(dut.probe_hidden_payload.value))[:plan.model.d_ff]


def watched(plan, prefill):
    """What a step makes, in the order it makes it, as ``(name, layer)``: every layer's
    intermediates, then the head's; a prefill step's last layer makes only its xi, q, k and v
    (where they come from a table, k and v)."""
    layers = plan.model.n_layers
    out = []
    for layer in range(layers):
        last = prefill and layer == layers - 1
        names = LAYER_NAMES[:4] if last else LAYER_NAMES
        if last and plan.qkv.table:
            names = ("k", "v")
        out += [(name, layer) for name in names]
    return out if prefill else out + [(name, None) for name in TOP_NAMES]


def first_difference(observed, trace, names):
    for name, layer in names:
        want = getattr(trace if layer is None else trace.layers[layer], name).tolist()
        if observed[(name, layer)] != want:
            where = "the head" if layer is None else f"layer {layer}"
            return f"{where}, {name}: engine {observed[(name, layer)]}, golden {want}"
    return None


class TB:
    def __init__(self, dut, engine, rng):
        self.dut, self.engine = dut, engine
        self.cmd = StreamSource(dut, "cmd", engine.cmd.payload.shape(), dut.clk)
        self.tokens = StreamSink(dut, "tokens", engine.tokens.payload.shape(), dut.clk, stall=0.2, rng=rng)
        self.status_layout = engine.status.shape()
        self.observer = Observer(dut, engine)
        self.cycles = []  # (position, cycles of the step)
        self.prefill_cycles = []  # the same, of prefill steps
        self.step_ends = []  # (cycle, cycles of the step) of every step, prefill ones too
        self.timelines = {}  # position → when each intermediate's first and last values left, from the step's start
        self.prefills = set()  # the steps (by index in the observer's) that were prefill steps
        self.prefilling = False
        self.steps_to_open = 0  # generated steps whose record opens as the one before ends
        self.steps_done = 0  # over all the bench's prompts (the engine's own count restarts at NEW)
        steps_file = bench_params().get("steps_file")
        self.steps_file = Path(steps_file) if steps_file else None

    async def status(self):
        await ReadOnly()
        status = unpack(self.status_layout, int(self.dut.status.value))
        await RisingEdge(self.dut.clk)
        return status

    async def idle(self, limit=1_000_000):
        for _ in range(limit):
            status = await self.status()
            if not status["busy"]:
                return status
        raise TimeoutError(f"the engine is still busy after {limit} cycles: {status}")

    async def command(self, op, arg=0):
        await self.cmd.send([{"op": op, "arg": arg}])
        await ClockCycles(self.dut.clk, 1)
        return await self.idle()

    async def watch_steps(self):
        """Record each finished step's position and cycles: both change with ``steps``."""
        steps = 0
        while True:
            await RisingEdge(self.dut.clk)
            await ReadOnly()
            status = unpack(self.status_layout, int(self.dut.status.value))
            if status["steps"] > steps:
                kind = self.prefill_cycles if self.prefilling else self.cycles
                kind.append((status["pos"] - 1, status["cycles"]))
                self.step_ends.append((cycle_now(), status["cycles"]))
                self.steps_done += 1
                if self.steps_file:  # for the launcher's progress, never read half-written
                    written = self.steps_file.with_suffix(".new")
                    written.write_text(str(self.steps_done))
                    written.replace(self.steps_file)
                if self.steps_to_open:  # the next generated step starts in this cycle
                    self.observer.new_step()
                    self.steps_to_open -= 1
            steps = status["steps"]

    async def feed(self, token, prefill=False):
        self.observer.new_step()
        if prefill:
            self.prefills.add(len(self.observer.steps) - 1)
        self.prefilling = prefill
        status = await self.command(Op.PREFILL if prefill else Op.FEED, token)
        self.prefilling = False
        return status

    async def generate(self, count):
        """Generate, recording each step's cycles; returns the tokens.

        The first token is the last fed step's; each of the ``count − 1`` steps after it is
        recorded from its start: the first with the command, each next one as the engine ends
        the step before (not as a token arrives: tokens wait on the device while the next step
        runs, so a slow reader would see the next step's first values first).
        """
        if count > 1:
            self.observer.new_step()
        self.steps_to_open = max(0, count - 2)
        await self.cmd.send([{"op": Op.GENERATE, "arg": count}])
        tokens = []
        for _ in range(count):
            tokens += await self.tokens.receive(1, timeout=1_000_000)
        status = await self.idle()
        return tokens, status


async def check_generation(tb, model, prompt, count):
    all_traces = list(Golden(model).steps(prompt, count))
    want = [t.next for t in all_traces[len(prompt) - 1:]]

    tb.observer.steps.clear()
    tb.observer.timelines.clear()
    tb.step_ends.clear()
    tb.observer.by_position.clear()
    tb.prefills.clear()
    status = await tb.command(Op.NEW)
    assert status["pos"] == 0 and status["error"] == Error.NONE
    for index, tok in enumerate(prompt):
        # As the protocol runs a FEED frame: all but the last token as prefill steps.
        status = await tb.feed(tok, prefill=index < len(prompt) - 1)
        assert status["error"] == Error.NONE, status
    got, status = await tb.generate(count)
    assert status["error"] == Error.NONE, status
    # Every intermediate of every step, not only the tokens: the first difference is named.
    assert len(tb.observer.steps) == len(all_traces)
    for index, (observed, trace) in enumerate(zip(tb.observer.steps, all_traces)):
        observed = {**observed, **tb.observer.by_position.get(trace.pos, {})}
        difference = first_difference(observed, trace, watched(tb.engine.plan, index in tb.prefills))
        if difference:
            raise AssertionError(
                f"tokens: engine {got}, golden {want}; first difference at step {index} "
                f"(position {trace.pos}, token {trace.tok}"
                f"{', a prefill step' if index in tb.prefills else ''}): {difference}")
    assert got == want, f"tokens differ: engine {got}, golden {want}"
    assert status["pos"] == len(prompt) + count - 1
    for index, (timeline, trace, (end, cycles)) in enumerate(zip(tb.observer.timelines, all_traces, tb.step_ends)):
        if index not in tb.prefills:
            tb.timelines[trace.pos] = [[*key, first - (end - cycles), last - (end - cycles)]
                                       for key, (first, last) in timeline.items()]
    return got


async def load_model(dut, engine, model):
    """Every byte of ``model``'s images into a loadable engine's ``load`` port, as the protocol
    passes them on, in order."""
    source = StreamSource(dut, "load", engine.load.payload.shape(), dut.clk)
    await source.send([{"memory": memory, "address": address, "data": byte}
                       for memory, image in load_images(engine.plan, model).items()
                       for address, byte in enumerate(image)])


@cocotb.test()
async def generations_match_golden(dut):
    params = bench_params()
    model = from_json(params["model"])
    engine = engine_of(model, Shape(**params["shape"]), params.get("loadable", False))
    rng = random.Random(params["seed"])
    await start(dut)
    if params.get("loadable"):
        await load_model(dut, engine, model)
    tb = TB(dut, engine, rng)
    cocotb.start_soon(tb.observer.run())
    cocotb.start_soon(tb.watch_steps())
    for prompt in params["prompts"]:
        count = model.seq_len - len(prompt) + 1
        tb.cycles.clear()
        await check_generation(tb, model, prompt, count)
    if params.get("report"):
        Path(params["report"]).write_text(json.dumps({"cycles": tb.cycles, "prefill_cycles": tb.prefill_cycles,
                                                      "timelines": tb.timelines}))


@cocotb.test()
async def bad_input_is_reported_and_harmless(dut):
    params = bench_params()
    model = from_json(params["model"])
    engine = engine_of(model, Shape(**params["shape"]), params.get("loadable", False))
    await start(dut)
    if params.get("loadable"):
        await load_model(dut, engine, model)
    tb = TB(dut, engine, random.Random(1))
    cocotb.start_soon(tb.observer.run())
    cocotb.start_soon(tb.watch_steps())

    status = await tb.command(Op.NEW)
    status = await tb.command(Op.GENERATE, 3)
    assert status["error"] == Error.NO_PROMPT and status["pos"] == 0
    prompt = [1 % model.vocab, 2 % model.vocab]
    status = await tb.feed(prompt[0], prefill=True)
    assert status["error"] == Error.NONE and status["pos"] == 1, status
    # A prefill step leaves no next token to generate from.
    status = await tb.command(Op.GENERATE, 3)
    assert status["error"] == Error.NO_PROMPT and status["pos"] == 1
    if model.vocab < 256:
        for prefill in (False, True):
            status = await tb.feed(model.vocab, prefill)
            assert status["error"] == Error.TOKEN and status["pos"] == 1, status
            status = await tb.feed(255, prefill)
            assert status["error"] == Error.TOKEN and status["pos"] == 1, status
    await tb.feed(prompt[1])
    status = await tb.command(Op.GENERATE, 0)
    assert status["error"] == Error.COUNT and status["pos"] == 2
    status = await tb.command(Op.GENERATE, model.seq_len)
    assert status["error"] == Error.POSITION and status["pos"] == 2
    # The rejected commands left the sequence intact: it goes on exactly as the golden one.
    count = model.seq_len - len(prompt) + 1
    got, status = await tb.generate(count)
    want = [t.next for t in Golden(model).generate(prompt, count)]
    assert got == want and status["error"] == Error.NONE
    assert status["pos"] == model.seq_len
    for prefill in (False, True):
        status = await tb.feed(0, prefill)
        assert status["error"] == Error.POSITION and status["pos"] == model.seq_len
    got, status = await tb.generate(1)  # the token already made: no step needed
    assert got == want[-1:] and status["error"] == Error.NONE
    # A new sequence after a full one: no stale row of the old one is read.
    await check_generation(tb, model, prompt[::-1], 3)
