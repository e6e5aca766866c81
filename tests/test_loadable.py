"""A loadable build (docs/loading.md): the simulated board built for a shape with no model in
it, models loaded over its serial line by the host driver, every token held to the golden model."""

import sys

import numpy as np
import pytest
import serial

from host.device import Device, DeviceError, NotLoadable, loadable_plan
from host.protocol import Command, Fault, Reply, encode_request, load_payloads
from int8model import Golden
from int8model.format import from_json
from int8model.synthetic import random_model
from plan import LimitError, check_limits, limits_for
from plan.loading import load_images, load_targets
from sim.board import SimulatedBoard
from wire import Ident

DEEP_SHAPE = dict(d_model=16, n_heads=2, d_ff=32, vocab=16, seq_len=10, n_layers=2)


def golden_tokens(model, prompt, count):
    return [t.next for t in Golden(model).generate(prompt, count)]


def models_of_one_shape(seed, count, **shape):
    """``count`` random models of ``shape``, all within the first one's limits."""
    rng = np.random.default_rng(seed)
    first = random_model(rng, **shape)
    limits, models = limits_for(first), [first]
    while len(models) < count:
        candidate = random_model(rng, **shape)
        try:
            check_limits(candidate, limits)
        except LimitError:
            continue
        models.append(candidate)
    return models


@pytest.fixture(scope="module")
def deep_models():
    return models_of_one_shape(31, 2, **DEEP_SHAPE)


@pytest.fixture(scope="module")
def deep_board(deep_models, tmp_path_factory):
    path = tmp_path_factory.mktemp("loadable") / "first.json"
    deep_models[0].save(path)
    board = SimulatedBoard(path, loadable=True)
    device = Device(serial.Serial(board.port, timeout=60))
    yield device
    device.close()
    board.close()


def run_to_the_end(device, model, prompt):
    count = model.seq_len - len(prompt) + 1
    device.reset()
    device.feed(prompt)
    return list(device.generate(count)), golden_tokens(model, prompt, count)


def expect_fault(device, tag, fault):
    with pytest.raises(DeviceError) as error:
        device.reply(tag)
    assert error.value.fault == fault


@pytest.mark.slow
def test_two_models_in_turn(deep_board, deep_models):
    """One board, no model at power-up: each of two deep models loaded in turn runs to the end
    of its context, every token the golden model's; IDENT states the limits, then the identity."""
    ident = deep_board.ident()
    assert ident.loadable and ident.sha256 == "00" * 32
    assert (ident.d_model, ident.n_layers, ident.multiplier_bits) == (16, 2, limits_for(deep_models[0]).multiplier_bits)
    deep_board.write_raw(encode_request(Command.FEED, 90, bytes([1])))
    expect_fault(deep_board, 90, Fault.NO_MODEL)
    assert deep_models[0].sha256 != deep_models[1].sha256
    for model, prompt in zip(deep_models, ([3, 1, 4], [15, 0, 9, 2])):
        progress = []
        sent = deep_board.load_model(model, progress=lambda done, total: progress.append((done, total)))
        assert progress[-1] == (sent, sent) and len(progress) > 1
        assert deep_board.ident().sha256 == model.sha256
        got, want = run_to_the_end(deep_board, model, prompt)
        assert got == want


@pytest.mark.slow
def test_a_boot_image_runs_its_model_at_power_up(deep_models, tmp_path):
    """A board whose boot image holds the second model, as ``hdl.build --from`` writes it: at
    power-up, with nothing sent, IDENT names that model and it runs to the end of its context,
    every token the golden model's."""
    deep_models[0].save(tmp_path / "shape.json")
    deep_models[1].save(tmp_path / "boot.json")
    board = SimulatedBoard(tmp_path / "shape.json", loadable=True, boot=tmp_path / "boot.json")
    device = Device(serial.Serial(board.port, timeout=60))
    try:
        assert device.ident().sha256 == deep_models[1].sha256
        got, want = run_to_the_end(device, deep_models[1], [7, 2])
        assert got == want
    finally:
        device.close()
        board.close()


@pytest.mark.slow
def test_half_loaded_model_never_runs(deep_board, deep_models):
    """Chunks of a load, then no commit: FEED and GENERATE are refused; a RESET abandons the
    load (still refused); a whole load then runs."""
    model = deep_models[1]
    images = load_images(loadable_plan(deep_board.ident()), model)
    for tag, payload in enumerate(list(load_payloads(images))[:2], start=80):
        deep_board.write_raw(encode_request(Command.LOAD, tag, payload))
        assert deep_board.reply(tag)[0] == Reply.OK
    deep_board.write_raw(encode_request(Command.FEED, 91, bytes([1])))
    expect_fault(deep_board, 91, Fault.NO_MODEL)
    deep_board.reset()
    deep_board.write_raw(encode_request(Command.GENERATE, 92, (1).to_bytes(2, "little")))
    expect_fault(deep_board, 92, Fault.NO_MODEL)
    deep_board.load_model(model)
    got, want = run_to_the_end(deep_board, model, [5, 5])
    assert got == want


@pytest.mark.slow
def test_refused_before_anything_is_sent(deep_board, deep_models):
    """A model of another shape, or outside the build's limits, is refused by the host, naming
    the field and the limit; the device's model is untouched."""
    model = deep_models[0]
    deep_board.load_model(model)
    other_shape = random_model(np.random.default_rng(3), **{**DEEP_SHAPE, "d_ff": 16})
    with pytest.raises(LimitError, match="config.d_ff is 16; this build's shape has 32"):
        deep_board.load_model(other_shape)
    doc = model.to_json()
    doc["requant"]["M_o"][1] = [1 << 20, 30]
    wide = from_json(doc)
    with pytest.raises(LimitError, match="requant.M_o of layer 1 has multiplier 1048576, 22 bits"):
        deep_board.load_model(wide)
    assert deep_board.ident().sha256 == model.sha256
    got, want = run_to_the_end(deep_board, model, [2])
    assert got == want


def test_a_baked_build_is_not_loadable():
    baked = Ident("ab" * 32, 16, 2, 32, 16, 10, 2, 16, 12_000_000, 3_000_000, 4, 0)
    with pytest.raises(NotLoadable, match="baked build"):
        loadable_plan(baked)


def test_images_fill_their_memories(deep_models):
    """Every memory's image is its depth in whole words, and the rule registers hold each
    stage's two pairs and each layer's M_score."""
    from plan import make_loadable_plan
    plan = make_loadable_plan(limits_for(deep_models[0]))
    images = load_images(plan, deep_models[0])
    for target in load_targets(plan):
        assert len(images[target.index]) == target.size
    assert load_targets(plan)[0].depth == 2 * 7 * 2 + 2


@pytest.mark.slow
@pytest.mark.parametrize("which", ["shipped", "random"])
def test_loadable_engine_matches_golden(which):
    """A loadable build's engine, its memories and rule registers written through its load
    port, held to the golden model at every intermediate of every step of a whole context."""
    from plan import Shape
    from int8model import load
    from sim.bench_engine import run_engine
    model = load("models/zen32.json") if which == "shipped" else \
        random_model(np.random.default_rng(7), d_model=16, n_heads=4, d_ff=48, vocab=20, seq_len=9)
    run_engine(model, Shape(), [[1, 2, 3]], prefix=f"loadable_{which}", loadable=True)


def test_loadable_plan_refusals():
    from plan import FitError, Limits, Shape, make_loadable_plan
    limits = Limits(16, 2, 32, 16, 10)
    with pytest.raises(FitError, match="at most 24-bit, not 30"):
        make_loadable_plan(Limits(16, 2, 32, 16, 10, multiplier_bits=30))
    with pytest.raises(FitError, match="tables are made of a model's values"):
        make_loadable_plan(limits, Shape(qkv_table=True))


@pytest.mark.slow
def test_generate_loads_a_model(deep_models, tmp_path, capsys):
    """``host.generate --backend sim --load``: the simulated board built for the model's shape
    with no model in it, the model uploaded with a progress bar and its time, then the
    generation, every token the golden model's. A small deep model: the shipped one takes the
    same path with twice the bytes (docs/loading.md); its images are held to the golden model
    through the load port in test_loadable_engine_matches_golden."""
    from host.generate import main
    model = deep_models[1]
    path = tmp_path / "model.json"
    model.save(path)
    prompt = [3, 1, 4]
    assert main(["--backend", "sim", "--load", "--model", str(path), "--prompt", "3,1,4"]) == 0
    out, err = capsys.readouterr()
    count = model.seq_len - len(prompt) + 1
    assert out.split("\n")[:-1] == [f"GEN {i} {tok}" for i, tok in enumerate(golden_tokens(model, prompt, count))]
    assert "loading the model [" in err and "loaded " in err, err
    print(err.splitlines()[-1], file=sys.stderr)
