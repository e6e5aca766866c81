"""The plan: decisions made before any hardware exists, and held against the hardware built from them."""

import dataclasses
import json

import numpy as np
import pytest

from int8model import Golden, load
from int8model.golden import c8, rq
from int8model.synthetic import random_model
from plan import PARTS, FitError, Shape, choose_plan, limits_for, make_contents, make_plan
from plan.plan import REGISTERED_FEED_LANES
from plan.schedule import MATRICES, STAGES, Matrix, Stage

SHIPPED = "models/zen32.json"


def test_a_plan_is_frozen_and_prints_as_json():
    plan = make_plan(load(SHIPPED))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.shape = Shape()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.lanes.lanes = 8
    doc = json.loads(json.dumps(plan.to_json()))
    assert doc["shape"]["lanes"] == 32 and doc["lanes"]["acc_bits"] == plan.lanes.acc_bits
    assert len(doc["stages"]) == 1 and doc["stages"][0][Stage.O]["step"]["first"] == "M_o"
    assert doc["resources"]["MULT18X18D"] == plan.dsp_blocks
    assert {m["path"] for m in doc["memories"]} == {m.path for m in plan.memories}


def test_the_stages_are_the_golden_step():
    """Each stage of the plan's table, its rules applied in order to the golden model's own
    values (adding and storing as the table says), makes the golden model's next value: the
    table is docs/semantics.md's steps 1 to 7, for models whose hidden rules fold, take a table
    and take a second requant, and for deep ones, whose layers below the last end in the next
    layer's x and xi."""
    for seed, r_hid, n_layers in ((1, None, 1), (2, (1, 3), 1), (3, (3, 3), 1), (5, None, 3)):
        model = random_model(np.random.default_rng(seed), 16, 2, 24, 16, 8, n_layers=n_layers)
        if r_hid:
            model.requant["r_hid"] = r_hid
        plan = make_plan(model)
        assert len(plan.stages) == n_layers
        golden = Golden(model)
        for tok in (3, 1, 4):
            trace = golden.step(tok)
            for layer, (params, lt) in enumerate(zip(model.layers, trace.layers)):
                top = layer == n_layers - 1
                w = params.weights
                sums = {Stage.EMBED: lt.x, Stage.Q: lt.xi @ w["Wq"], Stage.K: lt.xi @ w["Wk"],
                        Stage.V: lt.xi @ w["Wv"], Stage.O: lt.ci @ w["Wo"], Stage.H: lt.hi @ w["W1"],
                        Stage.F: lt.fi @ w["W2"]}
                expected = {name: getattr(lt, name) for name in ("xi", "q", "k", "v", "hi", "fi")}
                expected["oi"] = trace.oi if top else trace.layers[layer + 1].xi
                stored = {"x": lt.x}
                for stage in plan.stages[layer]:
                    assert stage.layer == layer
                    values = sums[stage.stage].tolist()
                    for rule, adds in ((stage.first, stage.adds), (stage.then, None)):
                        if rule is not None:
                            values = [rule.apply(v) + (stored[adds][e] if adds else 0) for e, v in enumerate(values)]
                    if stage.stores:
                        stored[stage.stores] = values
                    if stage.last is not None:
                        values = [stage.last.apply(v) for v in values]
                    assert values == expected[stage.step.output].tolist(), (seed, layer, stage.stage)
                assert stored["s1"] == lt.s1.tolist()
                assert stored["x"] == (lt.x if top else lt.s2).tolist()


def test_the_first_rule_adds_after_its_shift():
    """The residual's addend enters after the first requant's shift: for O and F the table's
    rule is rq (wide, no clamp) and adds x, s1 as docs/semantics.md's steps 4 and 6 write."""
    model = load(SHIPPED)
    plan = make_plan(model)
    x = np.array([-5000, 123, 7])
    acc = np.array([12345, -999, 0])
    o = plan.stage(Stage.O)
    assert [o.first.apply(a) + v for a, v in zip(acc, x)] == (x + rq(acc, model.requant["M_o"])).tolist()
    assert [o.last.apply(v) for v in x] == c8(rq(x, model.requant["r_ffn"])).tolist()
    assert [step.stage for step in STAGES] == list(Stage)
    assert [step.matrix for step in MATRICES] == list(Matrix)
    assert plan.order == [Matrix.WO, Matrix.W1, Matrix.W2, Matrix.HEAD]  # q, k, v from the table


def test_a_part_too_small_is_refused_before_any_hardware():
    model = random_model(np.random.default_rng(4), 64, 4, 256, 64, 128)
    with pytest.raises(FitError) as refused:
        make_plan(model, Shape(64, 4), "25F")
    message = str(refused.value)
    assert "block RAM" in message and "multipliers" in message and "the LFE5U-25F has 28" in message
    assert choose_plan(model, "85F").dsp_blocks <= PARTS["85F"].MULT18X18D


def test_wide_lanes_take_their_words_through_registers():
    """From ``REGISTERED_FEED_LANES`` lanes on, the plan puts registers between the epilogues'
    output and the lanes' input, and between attention's context and it (a wide lane array's
    input is far from both), and the engine builds them there, with the lanes' input queue's
    head in a register; narrower lanes take the words straight."""
    from amaranth.hdl import Fragment
    from hdl.engine import Engine
    model = random_model(np.random.default_rng(6), 64, 4, 64, 16, 8)
    for lanes in (REGISTERED_FEED_LANES // 2, REGISTERED_FEED_LANES):
        plan = make_plan(model, Shape(lanes, 2))
        registered = lanes >= REGISTERED_FEED_LANES
        assert plan.feed_registered == registered
        engine = Engine(plan)
        units = {name for _, name, _ in Fragment.get(engine, None).subfragments}
        assert "feed" in units and ("epilogue_words" in units) == ("context_words" in units) == registered
        assert engine.feed.registered_head == registered


def test_contents_belong_to_their_model():
    shipped = load(SHIPPED)
    other = random_model(np.random.default_rng(5), 32, 4, 32, 32, 32)
    with pytest.raises(ValueError, match="the plan was made for model sha256"):
        make_contents(make_plan(shipped), other)


DESIGNS = [
    ("shipped 85F", None, None),
    ("shipped 45F", None, "45F"),
    ("random computed q, k, v", (1, 32, 4, 32, 40, 32, 1, Shape(33, 3, 1, qkv_table=False)), None),
    ("random hidden in lanes, four rows", (2, 16, 2, 16, 24, 40, 1, Shape(16, 2, 1, hidden_in_lanes=True,
                                                                           attention_rows=4)), None),
    ("random d_model 64, d_ff 128", (3, 64, 4, 128, 64, 64, 1, None), "85F"),
    ("random 4 layers", (4, 32, 4, 64, 40, 48, 4, None), "85F"),
    ("shipped shape loadable, its boot image", "loadable", "85F"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model_shape, device", [(m, d) for _, m, d in DESIGNS], ids=[n for n, _, _ in DESIGNS])
def test_the_plan_counts_what_the_design_instantiates(tmp_path, model_shape, device):
    """The device top as the plan builds it, through Yosys' synthesis for the ECP5 up to its RAM
    mapping: every memory is the plan's (path, depth, width, kind of RAM), and the block RAMs
    and multipliers it maps to are the plan's count, so the fit check cannot drift from the
    design."""
    from flows.cost import mapped_resources
    from hdl.top import DeviceTop
    if model_shape is None:
        model = load(SHIPPED)
        plan = choose_plan(model, device or "85F")
    elif model_shape == "loadable":
        model = load(SHIPPED)
        plan = choose_plan(None, device, limits=limits_for(model))
        assert plan.boot
    else:
        seed, d, heads, d_ff, vocab, seq_len, layers, shape = model_shape
        model = random_model(np.random.default_rng(seed), d, heads, d_ff, vocab, seq_len, n_layers=layers)
        plan = choose_plan(model, device) if shape is None else make_plan(model, shape)
    top = DeviceTop(plan, None if plan.loadable else make_contents(plan, model), clock_hz=60_000_000)
    design = mapped_resources(top, "top", tmp_path)
    planned = sorted((m.path, m.depth, m.width, m.style) for m in plan.memories)
    assert design["memories"] == planned
    assert (design["DP16KD"], design["MULT18X18D"]) == (plan.block_rams, plan.dsp_blocks)


@pytest.mark.slow
@pytest.mark.parametrize("depth, width", [(20480, 24), (640, 39), (1024, 768), (5000, 13), (56, 256), (33000, 2)])
def test_a_memory_takes_the_block_rams_the_plan_counts(tmp_path, depth, width):
    """A block-RAM memory of random contents, alone through Yosys' mapping: as many DP16KD as
    the plan's rule says (it packs the words left over from a block's depth into its rows)."""
    import random
    from amaranth.hdl import Module
    from amaranth.lib import memory, wiring
    from amaranth.lib.wiring import In, Out
    from flows.cost import mapped_resources
    from plan.parts import blocks_for
    rng = random.Random(depth)

    class ROM(wiring.Component):
        addr: In(range(depth))
        data: Out(width)

        def elaborate(self, platform):
            m = Module()
            m.submodules.table = table = memory.Memory(
                shape=width, depth=depth, init=[rng.randrange(1 << width) for _ in range(depth)],
                attrs={"ram_style": "block"})
            read = table.read_port()
            m.d.comb += [read.addr.eq(self.addr), self.data.eq(read.data)]
            return m
    assert mapped_resources(ROM(), "rom", tmp_path)["DP16KD"] == blocks_for(depth, width)
