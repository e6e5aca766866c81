"""The simulated board (UART, protocol and engine under Icarus) driven by the real host driver."""

import random
import subprocess
import sys

import numpy as np
import pytest
import serial

from host.device import Device, DeviceError, IdentityMismatch
from host.protocol import Command, Fault, Reply, crc8, encode_request
from int8model import Golden, load
from int8model.format import from_json
from int8model.synthetic import random_model
from plan import choose_plan
from sim.board import SIM_BAUD, SIM_CLOCK_HZ, SimulatedBoard

SHIPPED = "models/zen32.json"


@pytest.fixture(scope="module")
def model():
    return load(SHIPPED)


@pytest.fixture(scope="module")
def device():
    board = SimulatedBoard(SHIPPED)
    dev = Device(serial.Serial(board.port, timeout=60))
    yield dev
    dev.close()
    board.close()


def golden_tokens(model, prompt, count):
    return [t.next for t in Golden(model).generate(prompt, count)]


def test_crc_matches_the_catalogue():
    """The host's CRC, from the parameters in wire, is the one the device's (Amaranth's
    catalogue) computes: CRC-8/AUTOSAR, whose check value is 0xDF."""
    from amaranth.lib import crc
    from hdl.protocol import CRC8
    assert crc8(b"123456789") == 0xDF
    assert CRC8 is crc.catalog.CRC8_AUTOSAR and CRC8(8).compute(b"123456789") == 0xDF


def test_ident(device, model):
    """IDENT names the model and the shape the simulated board was built in: the 85F build's."""
    ident = device.ident()
    shape = choose_plan(model, "85F").shape
    assert ident.sha256 == model.sha256
    assert (ident.d_model, ident.n_heads, ident.d_ff, ident.vocab, ident.seq_len, ident.n_layers) == \
        (32, 4, 32, 32, 32, 1)
    assert (ident.lanes, ident.clock_hz, ident.baud) == (shape.lanes, SIM_CLOCK_HZ, SIM_BAUD)
    assert (ident.ways, ident.lut_ways) == (shape.ways, shape.lut_ways)


def test_whole_generation_equals_golden(device, model):
    prompt = [3, 1, 4, 1, 5]
    count = model.seq_len - len(prompt) + 1
    device.reset()
    assert device.feed(prompt) == len(prompt)
    assert list(device.generate(count)) == golden_tokens(model, prompt, count)
    stats = device.stats()
    assert stats.pos == model.seq_len and stats.steps == model.seq_len and stats.cycles > 0


def test_token_replies_carry_every_queued_token(device, model):
    """A token's own reply takes 240 cycles of this line, a step about 200: tokens queue up,
    and a reply takes all that are queued."""
    prompt = [7, 7, 2]
    count = model.seq_len - len(prompt) + 1
    device.reset()
    device.feed(prompt)
    device.write_raw(encode_request(Command.GENERATE, 220, count.to_bytes(2, "little")))
    replies = []
    while sum(map(len, replies)) < count:
        kind, payload = device.reply(220)
        assert kind == Reply.TOKEN
        replies.append(payload)
    assert device.reply(220) == (Reply.OK, model.seq_len.to_bytes(2, "little"))
    assert [t for r in replies for t in r] == golden_tokens(model, prompt, count)
    assert len(replies) < count and max(map(len, replies)) > 1


def expect_fault(device, tag, fault):
    with pytest.raises(DeviceError) as error:
        device.reply(tag)
    assert error.value.fault == fault


def test_bad_input_leaves_the_sequence_intact(device, model):
    rng = random.Random(5)
    prompt = [17, 9, 30, 2]
    device.reset()
    device.feed(prompt)

    # Garbage, sync bytes included: whatever the device makes of it, it comes back.
    device.write_raw(bytes(rng.randrange(256) for _ in range(300)) + b"\xa5\x03")
    device.resync()
    assert device.stats().pos == len(prompt)

    # A truncated frame: the header promises five tokens, two come.
    device.write_raw(encode_request(Command.FEED, 200, bytes([1, 2, 3, 4, 5]))[:6])
    expect_fault(device, 200, Fault.TRUNCATED)

    # A corrupted frame.
    frame = bytearray(encode_request(Command.FEED, 201, bytes([1, 2])))
    frame[-1] ^= 0x40
    device.write_raw(frame)
    expect_fault(device, 201, Fault.CRC)

    # Tokens outside the vocab: the whole frame is refused, not just its bad token.
    device.write_raw(encode_request(Command.FEED, 202, bytes([1, 2, model.vocab])))
    expect_fault(device, 202, Fault.TOKEN)
    device.write_raw(encode_request(Command.FEED, 203, bytes([255])))
    expect_fault(device, 203, Fault.TOKEN)

    # Unknown commands and wrong lengths.
    device.write_raw(encode_request(0x77, 204))
    expect_fault(device, 204, Fault.UNKNOWN)
    device.write_raw(encode_request(Command.IDENT, 205, b"x"))
    expect_fault(device, 205, Fault.LENGTH)
    device.write_raw(encode_request(Command.GENERATE, 206, b"\x01"))
    expect_fault(device, 206, Fault.LENGTH)
    device.write_raw(encode_request(Command.FEED, 207))
    expect_fault(device, 207, Fault.LENGTH)
    # A baked build loads no model, and says so.
    device.write_raw(encode_request(Command.LOAD, 213, bytes([0, 0, 0, 0, 1])))
    expect_fault(device, 213, Fault.BAKED)
    device.write_raw(encode_request(Command.GENERATE, 208, (0).to_bytes(2, "little")))
    expect_fault(device, 208, Fault.COUNT)

    # Past the end of the context.
    device.write_raw(encode_request(Command.FEED, 209, bytes([1] * (model.seq_len - len(prompt) + 1))))
    expect_fault(device, 209, Fault.POSITION)
    device.write_raw(encode_request(Command.GENERATE, 210, (model.seq_len).to_bytes(2, "little")))
    expect_fault(device, 210, Fault.POSITION)

    assert device.stats().pos == len(prompt)
    count = model.seq_len - len(prompt) + 1
    assert list(device.generate(count)) == golden_tokens(model, prompt, count)

    # A full cache refuses more, and stays readable.
    device.write_raw(encode_request(Command.FEED, 211, bytes([0])))
    expect_fault(device, 211, Fault.POSITION)
    device.write_raw(encode_request(Command.GENERATE, 212, (2).to_bytes(2, "little")))
    expect_fault(device, 212, Fault.POSITION)
    assert list(device.generate(1)) == golden_tokens(model, prompt, count)[-1:]


def test_generate_needs_a_prompt(device):
    device.reset()
    with pytest.raises(DeviceError) as error:
        list(device.generate(3))
    assert error.value.fault == Fault.NO_PROMPT


def test_refuses_a_device_built_for_another_model(device, model):
    doc = model.to_json()
    doc["exp_lut"][5] += 1
    other = from_json(doc)
    with pytest.raises(IdentityMismatch, match=f"{model.sha256}.*{other.sha256}"):
        device.check_model(other)


def test_generate_command_on_the_simulated_board():
    args = ["--model", SHIPPED, "--prompt", "3,1,4", "--generate", "12"]
    sim = subprocess.run([sys.executable, "-m", "host.generate", "--backend", "sim"] + args,
                         capture_output=True, text=True, check=True)
    golden = subprocess.run([sys.executable, "-m", "host.generate", "--backend", "golden"] + args,
                            capture_output=True, text=True, check=True)
    assert sim.stdout == golden.stdout and sim.stdout.count("GEN") == 12


def test_a_deep_model_on_the_simulated_board(tmp_path):
    """host.generate runs a deep model on the simulated board (built for it, as the 85F's build
    would shape it) and on the golden model, token for token the same; IDENT names its layers."""
    model = random_model(np.random.default_rng(31), 16, 2, 24, 12, 12, n_layers=3)
    path = tmp_path / "deep.json"
    model.save(path)
    args = ["--model", str(path), "--prompt", "3,1,4", "--generate", "6"]
    sim = subprocess.run([sys.executable, "-m", "host.generate", "--backend", "sim"] + args,
                         capture_output=True, text=True, check=True)
    golden = subprocess.run([sys.executable, "-m", "host.generate", "--backend", "golden"] + args,
                            capture_output=True, text=True, check=True)
    assert sim.stdout == golden.stdout and sim.stdout.count("GEN") == 6


def test_the_selftest_passes_on_the_simulated_board(device, model):
    from host.selftest import run_selftest
    steps, rate = run_selftest(device, model, prompts=2, seed=3)
    assert [(s.name, s.passed) for s in steps] == [(name, True) for name in ("ident", "identity", "generation",
                                                                             "recovery")]
    assert rate > 0


def test_the_selftest_fails_naming_the_step_on_a_board_built_for_another_model(device, model):
    from host.selftest import run_selftest
    doc = model.to_json()
    doc["exp_lut"][5] += 1
    steps, rate = run_selftest(device, from_json(doc))
    assert [(s.name, s.passed) for s in steps] == [("ident", True), ("identity", False)] and rate is None
    assert model.sha256 in steps[-1].detail


def test_the_selftest_command_on_the_simulated_board():
    done = subprocess.run([sys.executable, "-m", "host.selftest", "--backend", "sim", "--model", SHIPPED,
                           "--prompts", "1"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "self-test passed" in done.stdout and "recovery    pass" in done.stdout
