"""Loading over the line, at the protocol: a loadable build's LOAD and COMMIT in Amaranth's
simulator (docs/loading.md). The frames and the CRC-32 are the host's (``host.protocol``),
written from the documentation; behind the engine port, a stand-in that records every command
it is given, so that a step on a half-loaded model would be seen."""

import dataclasses
import struct

import numpy as np
import pytest

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hdl.boot import BootReplay, connect_boot
from hdl.interface import EngineControl, Op
from hdl.protocol import CommandProtocol, load_layout
from host.device import Device, DeviceError
from host.protocol import commit_payload, encode_request, load_frames, load_payloads
from plan.loading import BOOT_BLOCK, boot_pattern
from sim.protocol_host import SimulatedLine, parse_replies, send_bytes
from wire import COMMIT_FORMAT, COUNT_FORMAT, LOAD_HEADER_FORMAT, POSITION_FORMAT, Command, Fault, Ident, Reply
from wire.line import FRAMING

SEQ_LEN, VOCAB = 6, 12
BAKED_SHA = "cd" * 32
IDENT = Ident(BAKED_SHA, 8, 2, 8, VOCAB, SEQ_LEN, 1, 4, 12_000_000, 3_000_000, 1, 0)
BYTE_CYCLES = 2
TIMEOUT = 3 * BYTE_CYCLES
REPLY_LIMIT = 1000   # cycles: a chunk takes a cycle a byte
RNG = np.random.default_rng(7)
# Two memories' images, one of them longer than a chunk.
IMAGES = {0: RNG.integers(0, 256, 300, dtype=np.uint8).tobytes(), 3: RNG.integers(0, 256, 17, dtype=np.uint8).tobytes()}
NEW_SHA = "5e" * 32
# The build's memories: the bytes of each one's image, by index (1 and 2 take none).
SIZES = tuple(len(IMAGES.get(index, b"")) for index in range(max(IMAGES) + 1))


BOOTED = object()  # a session's step: wait until the boot image is replayed


def ok(tag, pos=0):
    return [(Reply.OK, tag, struct.pack(POSITION_FORMAT, pos))]


def error(tag, fault):
    return [(Reply.ERROR, tag, bytes([fault]))]


def request(command, tag, payload=b""):
    return encode_request(command, tag, payload)


def loadable_protocol(holds_model):
    return CommandProtocol(seq_len=SEQ_LEN, vocab=VOCAB, ident=IDENT.pack(), timeout=TIMEOUT, load_sizes=SIZES,
                           holds_model=holds_model)


def stand_ins(dut, written, ops):
    """What sits behind the protocol: an engine that records the ops it is given (and counts
    positions), memories that record each byte at its address, ``{memory: {address: byte}}``."""
    async def engine(ctx):
        ctx.set(dut.engine.cmd.ready, 1)
        pos = 0
        async for clock, _, valid, op in ctx.tick().sample(dut.engine.cmd.valid, dut.engine.cmd.payload.op):
            if valid:
                ops.append(Op(op))
                pos = 0 if op == Op.NEW else pos + 1
                ctx.set(dut.engine.status.pos, pos)

    async def memories(ctx):  # taking a byte on two cycles of three, as a slower memory might
        cycle = 0
        ctx.set(dut.load.ready, 1)
        async for clock, _, valid, ready, payload in ctx.tick().sample(dut.load.valid, dut.load.ready,
                                                                       dut.load.payload):
            if valid and ready:
                written.setdefault(payload.memory, {})[payload.address] = payload.data
            cycle += 1
            ctx.set(dut.load.ready, cycle % 3 != 0)
    return engine, memories


def session(steps, *, holds_model=False, dut=None):
    """Send each step's frame, read its replies, and compare them with the step's; returns the
    bytes the protocol sent towards the memories and the ops the engine was given. ``dut``: the
    loadable protocol by default; a step ``BOOTED`` waits for the end of its boot."""
    dut = dut or loadable_protocol(holds_model)
    written, ops, replies, failures = {}, [], [], []
    engine, memories = stand_ins(dut, written, ops)

    async def collect(ctx):
        ctx.set(dut.tx.ready, 1)
        async for clock, _, valid, byte in ctx.tick().sample(dut.tx.valid, dut.tx.payload):
            if valid:
                replies.append(byte)

    async def host(ctx):
        for step in steps:
            if step is BOOTED:
                await ctx.tick().until(dut.booting == 0)
                continue
            frame, expected = step
            start = len(replies)
            await send_bytes(ctx, dut.rx, frame, BYTE_CYCLES)
            for _ in range(REPLY_LIMIT // 16):
                if len(got := parse_replies(replies[start:], partial=True)) >= len(expected):
                    break
                await ctx.tick().repeat(16)
            if got != expected:
                failures.append(f"{bytes(frame).hex()}: expected {expected}, got {got}")
                return

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for background in (engine, memories, collect):
        sim.add_testbench(background, background=True)
    sim.add_testbench(host)
    sim.run()
    assert not failures, failures[0]
    return written, ops


def ident_with(sha):
    return dataclasses.replace(IDENT, sha256=sha).pack()


def load_steps(first_tag, images=IMAGES, skip=None, pos=0):
    """The LOADs of ``images`` (but the ``skip``th), each answered OK with the position."""
    payloads = list(load_payloads(images))
    steps = [(request(Command.LOAD, first_tag + n, payload), ok(first_tag + n, pos))
             for n, payload in enumerate(payloads) if n != skip]
    return steps, payloads


def as_images(written):
    return {memory: bytes(by_address[a] for a in range(len(by_address))) for memory, by_address in written.items()}


def test_a_load_committed_runs_and_identifies_itself():
    """No model at power-up: FEED and GENERATE are refused and IDENT's identity is the build's
    own. After the chunks and a commit whose CRC-32 checks, the memories hold every byte where
    it was sent, IDENT reports the new identity and a FEED runs."""
    loads, payloads = load_steps(10)
    written, ops = session([
        (request(Command.FEED, 1, bytes([3])), error(1, Fault.NO_MODEL)),
        (request(Command.GENERATE, 2, struct.pack(COUNT_FORMAT, 2)), error(2, Fault.NO_MODEL)),
        (request(Command.IDENT, 3), [(Reply.IDENT, 3, IDENT.pack())]),
        *loads,
        (request(Command.COMMIT, 4, commit_payload(NEW_SHA, payloads)), ok(4)),
        (request(Command.IDENT, 5), [(Reply.IDENT, 5, ident_with(NEW_SHA))]),
        (request(Command.FEED, 6, bytes([3, 4])), ok(6, 2)),
    ], holds_model=False)
    assert as_images(written) == IMAGES
    assert ops == [Op.NEW, Op.PREFILL, Op.FEED]


def test_a_corrupted_or_cut_chunk_writes_nothing_and_is_sent_again():
    loads, payloads = load_steps(10)
    corrupted = bytearray(loads[1][0])
    corrupted[7] ^= 0x40
    written, ops = session([
        loads[0],
        (bytes(corrupted), error(11, Fault.CRC)),
        (loads[1][0][:9], error(11, Fault.TRUNCATED)),
        *loads[1:],
        (request(Command.COMMIT, 4, commit_payload(NEW_SHA, payloads)), ok(4)),
    ], holds_model=False)
    assert as_images(written) == IMAGES
    assert ops == [Op.NEW]


def test_a_load_short_of_a_chunk_is_not_committed_and_nothing_runs():
    loads, payloads = load_steps(10, skip=1)
    _, ops = session([
        *loads,
        (request(Command.COMMIT, 4, commit_payload(NEW_SHA, payloads)), error(4, Fault.LOAD)),
        (request(Command.FEED, 5, bytes([3])), error(5, Fault.NO_MODEL)),
        (request(Command.IDENT, 6), [(Reply.IDENT, 6, IDENT.pack())]),
    ], holds_model=False)
    assert ops == []


def test_a_reset_mid_load_abandons_it():
    """A RESET between chunks: the commit of the rest is refused, and the whole load again is
    taken."""
    loads, payloads = load_steps(10)
    again, _ = load_steps(40)
    _, ops = session([
        loads[0],
        (request(Command.RESET, 2), ok(2)),
        *loads[1:],
        (request(Command.COMMIT, 4, commit_payload(NEW_SHA, payloads)), error(4, Fault.LOAD)),
        (request(Command.FEED, 5, bytes([3])), error(5, Fault.NO_MODEL)),
        *again,
        (request(Command.COMMIT, 6, commit_payload(NEW_SHA, payloads)), ok(6)),
        (request(Command.FEED, 7, bytes([3])), ok(7, 1)),
    ], holds_model=False)
    assert ops == [Op.NEW, Op.NEW, Op.FEED]


def test_a_model_at_power_up_runs_until_a_load_begins():
    """A build that starts with its model runs it; a COMMIT with nothing loaded is refused and
    changes nothing; from the first LOAD on, nothing runs until the commit."""
    loads, _ = load_steps(10, pos=1)
    _, ops = session([
        (request(Command.FEED, 1, bytes([3])), ok(1, 1)),
        (request(Command.COMMIT, 2, commit_payload(NEW_SHA, [])), error(2, Fault.LOAD)),
        (request(Command.IDENT, 3), [(Reply.IDENT, 3, IDENT.pack())]),
        loads[0],
        (request(Command.FEED, 4, bytes([3])), error(4, Fault.NO_MODEL)),
    ], holds_model=True)
    assert ops == [Op.FEED]


def chunk(memory, address, size):
    return struct.pack(LOAD_HEADER_FORMAT, memory, address & 0xFFFF, address >> 16) + bytes(range(1, size + 1))


@pytest.mark.parametrize("memory, address, size", [
    (len(SIZES), 0, 1),                        # no such memory
    (1, 0, 1),                                 # a memory of no bytes
    (3, SIZES[3] - 4, 5),                      # one byte past the end
    (0, (1 << 24) - 1, 2),                     # past the end of the address space
], ids=["no memory", "an empty memory", "a byte past the end", "wrapping"])
def test_a_chunk_outside_its_memory_writes_nothing_and_abandons_the_load(memory, address, size):
    """Refused ADDRESS before a byte moves: nothing is written, the commit of what came before
    is refused, nothing runs; the whole load again is taken. A chunk ending at its memory's
    last byte is taken (every image is sent whole)."""
    loads, payloads = load_steps(10)
    again, _ = load_steps(40)
    written, ops = session([
        loads[0],
        (request(Command.LOAD, 2, chunk(memory, address, size)), error(2, Fault.ADDRESS)),
        *loads[1:],
        (request(Command.COMMIT, 4, commit_payload(NEW_SHA, payloads)), error(4, Fault.LOAD)),
        (request(Command.FEED, 5, bytes([3])), error(5, Fault.NO_MODEL)),
        *again,
        (request(Command.COMMIT, 6, commit_payload(NEW_SHA, payloads)), ok(6)),
    ], holds_model=False)
    assert as_images(written) == IMAGES
    assert ops == [Op.NEW]


@pytest.mark.parametrize("payload", [b"\x00\x00\x00\x00", b"\x01" * 35])
def test_a_load_or_commit_of_the_wrong_length_is_refused(payload):
    command = Command.LOAD if len(payload) == 4 else Command.COMMIT
    session([(request(command, 9, payload), error(9, Fault.LENGTH))], holds_model=False)


class CorruptingLine:
    """A line that changes one byte of the ``nth`` frame written, once: noise on the wire."""

    def __init__(self, line, nth):
        self.line, self.nth, self.writes = line, nth, 0

    def write(self, data):
        self.writes += 1
        if self.writes == self.nth:
            data = bytearray(data)
            data[6] ^= 0x10
        self.line.write(data)

    def __getattr__(self, name):
        return getattr(self.line, name)


@pytest.mark.parametrize("corrupt", [None, 2], ids=["clean line", "a chunk corrupted"])
def test_the_host_loads_a_model_and_runs_it(corrupt):
    """``host.device.Device.load`` over the simulated protocol: every byte where it belongs,
    progress to the whole, the new identity, then a FEED runs; a chunk the line corrupts is
    answered CRC and sent again."""
    dut = loadable_protocol(holds_model=False)
    written, ops, progress = {}, [], []
    line = SimulatedLine(dut, byte_cycles=BYTE_CYCLES, testbenches=stand_ins(dut, written, ops))
    try:
        device = Device(CorruptingLine(line, corrupt) if corrupt else line)
        with pytest.raises(DeviceError, match="NO_MODEL"):
            device.feed([3])
        device.load(IMAGES, NEW_SHA, progress=lambda sent, total: progress.append((sent, total)))
        assert device.ident().sha256 == NEW_SHA
        assert device.feed([3, 4]) == 2
    finally:
        line.close()
    assert as_images(written) == IMAGES
    total = sum(map(len, IMAGES.values()))
    assert progress[-1] == (total, total) and len(progress) == len(list(load_payloads(IMAGES)))
    assert ops == [Op.NEW, Op.PREFILL, Op.FEED]


class BootedProtocol(wiring.Component):
    """A boot image, the line and the loadable protocol, joined as the device joins them
    (:func:`hdl.boot.connect_boot`), without the UART."""

    def __init__(self, image):
        self.boot, self.protocol = BootReplay(image), loadable_protocol(holds_model=False)
        super().__init__({"rx": In(stream.Signature(8)), "tx": Out(stream.Signature(8)),
                          "engine": Out(EngineControl(SEQ_LEN)), "load": Out(stream.Signature(load_layout())),
                          "booting": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.protocol = self.protocol
        connect_boot(m, self.boot, wiring.flipped(self.rx), wiring.flipped(self.tx), self.protocol)
        wiring.connect(m, self.protocol.engine, wiring.flipped(self.engine))
        wiring.connect(m, self.protocol.load, wiring.flipped(self.load))
        m.d.comb += self.booting.eq(self.boot.booting)
        return m


def boot_of(frames):
    return frames + bytes(BOOT_BLOCK - len(frames))


def test_a_boot_image_loads_its_model_at_power_up():
    """The frames of a load and its commit in the boot image: at power-up every byte is where
    it belongs, IDENT reports the model's identity and a FEED runs, no LOAD on the line."""
    written, ops = session([
        BOOTED,
        (request(Command.IDENT, 1), [(Reply.IDENT, 1, ident_with(NEW_SHA))]),
        (request(Command.FEED, 2, bytes([3, 4])), ok(2, 2)),
    ], dut=BootedProtocol(boot_of(load_frames(IMAGES, NEW_SHA))))
    assert as_images(written) == IMAGES
    assert ops == [Op.NEW, Op.PREFILL, Op.FEED]


def test_the_line_is_not_heard_while_booting():
    """A frame sent at power-up, while the image replays, is dropped unanswered: the host's
    retry finds the model loaded."""
    _, ops = session([
        (request(Command.FEED, 1, bytes([3])), []),
        BOOTED,
        (request(Command.FEED, 2, bytes([3])), ok(2, 1)),
    ], dut=BootedProtocol(boot_of(load_frames(IMAGES, NEW_SHA))))
    assert ops == [Op.NEW, Op.FEED]


@pytest.mark.parametrize("image", ["pattern", "a chunk corrupted", "the commit's CRC-32 wrong"])
def test_a_boot_image_without_a_whole_model_runs_nothing(image):
    """As synthesised (bytes with no frame in them), with one byte of a chunk changed (its CRC-8
    refuses it) or with a commit that does not match what was loaded: no model, IDENT the
    build's own identity."""
    frames = bytearray(load_frames(IMAGES, NEW_SHA))
    if image == "a chunk corrupted":
        frames[20] ^= 0x01
    elif image == "the commit's CRC-32 wrong":
        frames[:] = load_frames(IMAGES, NEW_SHA)[:-(FRAMING + struct.calcsize(COMMIT_FORMAT))]
        frames += encode_request(Command.COMMIT, 9, commit_payload(NEW_SHA, list(load_payloads(IMAGES))[1:]))
    boot = boot_pattern(BOOT_BLOCK) if image == "pattern" else boot_of(bytes(frames))
    written, ops = session([
        BOOTED,
        (request(Command.IDENT, 1), [(Reply.IDENT, 1, IDENT.pack())]),
        (request(Command.FEED, 2, bytes([3])), error(2, Fault.NO_MODEL)),
    ], dut=BootedProtocol(boot))
    assert ops == []
    if image == "pattern":
        assert written == {}
