"""The command protocol under fuzzing: valid, corrupted, truncated and garbage frames from
Hypothesis, against the protocol component in Amaranth's simulator.

Each example is a session of requests, each sent and its replies read before the next, as a
host does. Behind the protocol's engine port runs the golden model, shaped to the engine's
interface (``hdl.interface.EngineControl``: the command's checks, the steps, the tokens), so
that thousands of sessions take seconds; the engine itself is held to the golden model by its
own benches, and with the protocol by the simulated board's. The reference the replies are
checked against is written from docs/protocol.md: every valid request is answered with its tag
and the answer the golden model gives; a corrupted frame with ``ERROR CRC``, a truncated one
with ``ERROR TRUNCATED``, garbage with nothing; no refused command changes the sequence (the
position, the tokens that follow); nothing hangs.
"""

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from amaranth.sim import Simulator

from hdl.interface import Error, Op
from hdl.protocol import CommandProtocol
from host.protocol import encode_request
from int8model.golden import Golden
from sim.protocol_host import parse_replies, send_bytes
from int8model.synthetic import random_model
from wire import (COMMIT_FORMAT, COUNT_FORMAT, LOAD_HEADER_FORMAT, POSITION_FORMAT, REQUEST_SYNC, Command,
                  Fault, Ident, Reply, Stats)

MODEL = random_model(np.random.default_rng(11), 8, 2, 8, 12, 6)  # vocab 12, seq_len 6
IDENT = Ident("ab" * 32, 8, 2, 8, 12, 6, 1, 4, 12_000_000, 3_000_000, 1, 0).pack()
# Bytes come faster than any UART brings them (at four clocks a bit, one every 40 cycles): the
# protocol takes a byte a cycle, and the sessions run in a tenth of the cycles.
BYTE_CYCLES = 4
TIMEOUT = 3 * BYTE_CYCLES  # cycles of silence that end a frame
STEP_CYCLES = 3       # the engine stand-in's cycles a step
REPLY_LIMIT = 1500    # cycles within which a request's last reply must have come
FUZZ_SESSIONS = 500


class GoldenEngine:
    """The golden model behind the engine's port, keeping the interface's contract: a command
    is taken when idle and judged as the sequencer judges it; busy from acceptance to the last
    step's end; a generated token waits in an output register until taken."""

    def __init__(self, port):
        self.port = port

    async def run(self, ctx):
        port, golden = self.port, Golden(MODEL)
        pos = steps = 0
        next_token = None   # the last full step's, for GENERATE
        ctx.set(port.cmd.ready, 1)
        while True:
            _, _, valid, op, arg = await ctx.tick().sample(port.cmd.valid, port.cmd.payload.op, port.cmd.payload.arg)
            if not valid:
                continue
            ctx.set(port.cmd.ready, 0)
            ctx.set(port.status.busy, 1)
            await ctx.tick()
            error = Error.NONE
            if op == Op.NEW:
                golden.reset()
                pos = steps = 0
                next_token = None
            elif op in (Op.FEED, Op.PREFILL):
                if pos >= MODEL.seq_len:
                    error = Error.POSITION
                elif arg >= MODEL.vocab:
                    error = Error.TOKEN
                else:
                    await ctx.tick().repeat(STEP_CYCLES)
                    trace = golden.step(arg)
                    pos, steps = pos + 1, steps + 1
                    next_token = trace.next if op == Op.FEED else None
            elif op == Op.GENERATE:
                if next_token is None:
                    error = Error.NO_PROMPT
                elif arg == 0:
                    error = Error.COUNT
                elif pos + arg > MODEL.seq_len + 1:
                    error = Error.POSITION
                else:
                    token = next_token
                    for n in range(arg):
                        ctx.set(port.tokens.valid, 1)
                        ctx.set(port.tokens.payload, token)
                        await ctx.tick().until(port.tokens.ready)
                        ctx.set(port.tokens.valid, 0)
                        if n + 1 < arg:
                            await ctx.tick().repeat(STEP_CYCLES)
                            token = golden.step(token).next
                            pos, steps = pos + 1, steps + 1
                    next_token = token  # the last step's prediction: a further GENERATE repeats it
            ctx.set(port.status.error, error)
            ctx.set(port.status.pos, pos)
            ctx.set(port.status.steps, steps)
            ctx.set(port.status.busy, 0)
            ctx.set(port.cmd.ready, 1)


class Reference:
    """What docs/protocol.md says the device answers, request by request, with the golden
    model's tokens: a list of ``(reply type, tag, payload)``."""

    def __init__(self):
        self.golden = Golden(MODEL)
        self.pos = self.steps = 0
        self.next_token = None

    def answer(self, command, tag, payload):
        def error(fault):
            return [(Reply.ERROR, tag, bytes([fault]))]

        def ok():
            return [(Reply.OK, tag, struct.pack(POSITION_FORMAT, self.pos))]
        lengths = {Command.IDENT: 0, Command.RESET: 0, Command.STATS: 0, Command.GENERATE: 2,
                   Command.COMMIT: struct.calcsize(COMMIT_FORMAT)}
        if command not in set(Command):
            return error(Fault.UNKNOWN)
        if command == Command.FEED and not payload or command in lengths and len(payload) != lengths[command] \
                or command == Command.LOAD and len(payload) <= struct.calcsize(LOAD_HEADER_FORMAT):
            return error(Fault.LENGTH)
        if command in (Command.LOAD, Command.COMMIT):  # this build's model is baked in
            return error(Fault.BAKED)
        if command == Command.IDENT:
            return [(Reply.IDENT, tag, IDENT)]
        if command == Command.STATS:
            return [(Reply.STATS, tag, self.pos, self.steps)]
        if command == Command.RESET:
            self.golden.reset()
            self.pos = self.steps = 0
            self.next_token = None
            return ok()
        if command == Command.FEED:
            if any(token >= MODEL.vocab for token in payload):
                return error(Fault.TOKEN)
            if self.pos + len(payload) > MODEL.seq_len:
                return error(Fault.POSITION)
            for token in payload:
                self.next_token = self.golden.step(token).next
            self.pos += len(payload)
            self.steps += len(payload)
            return ok()
        count, = struct.unpack(COUNT_FORMAT, payload)
        if count > MODEL.seq_len:
            return error(Fault.POSITION)
        if self.next_token is None:
            return error(Fault.NO_PROMPT)
        if count == 0:
            return error(Fault.COUNT)
        if self.pos + count > MODEL.seq_len + 1:
            return error(Fault.POSITION)
        tokens = [self.next_token]
        for _ in range(count - 1):
            tokens.append(self.golden.step(tokens[-1]).next)
        self.pos += count - 1
        self.steps += count - 1
        self.next_token = tokens[-1]
        return [(Reply.TOKEN, tag, bytes(tokens))] + ok()


def merged(frames):
    """Consecutive TOKEN replies of one tag as one: how many tokens a reply carries depends on
    the timing, the tokens do not."""
    out = []
    for kind, tag, payload in frames:
        if out and kind == Reply.TOKEN and out[-1][0] == Reply.TOKEN and out[-1][1] == tag:
            out[-1] = (kind, tag, out[-1][2] + payload)
        else:
            out.append((kind, tag, payload))
    return out


def matches(expected, got):
    if len(expected) != len(got):
        return False
    for want, have in zip(expected, got):
        if want[0] == Reply.STATS:  # the stand-in counts no cycles: the position and steps only
            whole = have[0] == Reply.STATS and len(have[2]) == struct.calcsize(Stats.FORMAT)
            stats = Stats.unpack(have[2]) if whole else None
            if stats is None or have[1] != want[1] or (stats.pos, stats.steps) != want[2:]:
                return False
        elif want != have:
            return False
    return True


def run_session(actions):
    """Send each action's bytes, a byte every BYTE_CYCLES, and check what comes back."""
    dut = CommandProtocol(seq_len=MODEL.seq_len, vocab=MODEL.vocab, ident=IDENT, timeout=TIMEOUT)
    received = []
    failures = []

    async def collect(ctx):
        ctx.set(dut.tx.ready, 1)
        while True:
            _, _, valid, byte = await ctx.tick().sample(dut.tx.valid, dut.tx.payload)
            if valid:
                received.append(byte)

    async def host(ctx):
        reference = Reference()
        for kind, data, extra in actions:
            start = len(received)
            await send_bytes(ctx, dut.rx, data, BYTE_CYCLES)
            if kind == "request":
                command, tag, payload = extra
                expected = reference.answer(command, tag, payload)
            elif kind == "corrupt":
                expected = [(Reply.ERROR, data[2], bytes([Fault.CRC]))]
            elif kind == "truncated":
                expected = [(Reply.ERROR, None, bytes([Fault.TRUNCATED]))]
            else:
                expected = []
            # Wait for the last expected reply (or, for none, for as long as a frame's timeout).
            waited = 0
            while True:
                await ctx.tick().repeat(16)
                waited += 16
                try:
                    got = merged(parse_replies(received[start:]))
                except AssertionError:
                    got = None
                final = got is not None and len(got) >= len(expected) and (not got or got[-1][0] != Reply.TOKEN)
                if (expected and final) or waited > (REPLY_LIMIT if expected else 4 * TIMEOUT):
                    break
            if got is None:
                failures.append(f"{kind} {data.hex()}: malformed replies {bytes(received[start:]).hex()}")
                return
            if kind == "truncated" and len(got) == 1 and got[0][0] == Reply.ERROR:
                got = [(got[0][0], None, got[0][2])]  # the tag of a frame cut before its tag is any
            if not matches(expected, got):
                failures.append(f"{kind} {data.hex()}: expected {expected}, got {got}")
                return
        failures.append(None)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(GoldenEngine(dut.engine).run, background=True)
    sim.add_testbench(collect, background=True)
    sim.add_testbench(host)
    sim.run()
    assert failures == [None], failures[0]


# -- What a session is made of.

tags = st.integers(0, 255)
tokens = st.integers(0, MODEL.vocab - 1)


def request(command, payload):
    return st.builds(lambda tag, body: ("request", encode_request(command, tag, body), (command, tag, body)),
                     tags, payload)


valid_requests = st.one_of(
    request(Command.IDENT, st.just(b"")),
    request(Command.RESET, st.just(b"")),
    request(Command.STATS, st.just(b"")),
    request(Command.FEED, st.lists(tokens, min_size=1, max_size=MODEL.seq_len + 1).map(bytes)),
    request(Command.GENERATE, st.integers(0, MODEL.seq_len + 2).map(lambda n: struct.pack(COUNT_FORMAT, n))),
)
refused_requests = st.one_of(
    request(Command.FEED, st.lists(st.integers(0, 255), min_size=1, max_size=4).map(bytes)),  # tokens outside
    request(Command.GENERATE, st.integers(0, 0xFFFF).map(lambda n: struct.pack(COUNT_FORMAT, n))),
    st.builds(lambda command, tag, body: ("request", encode_request(command, tag, body), (command, tag, body)),
              st.integers(0, 255).filter(lambda c: c not in set(Command)), tags, st.binary(max_size=3)),
    st.builds(lambda command, tag, body: ("request", encode_request(command, tag, body), (command, tag, body)),
              st.sampled_from(list(Command)), tags, st.binary(max_size=3)),  # lengths a command may not take
    request(Command.LOAD, st.binary(min_size=5, max_size=12)),          # a baked build loads nothing
    request(Command.COMMIT, st.binary(min_size=36, max_size=36)),
)


@st.composite
def corrupted(draw):
    """A valid request with one byte after the sync changed: CRC-8 catches every error within
    eight bits. The length byte is left, so that where the frame ends stays known."""
    _, frame, _ = draw(st.one_of(valid_requests, refused_requests))
    at = draw(st.sampled_from([i for i in range(1, len(frame)) if i != 3]))
    flip = draw(st.integers(1, 255))
    frame = bytearray(frame)
    frame[at] ^= flip
    return ("corrupt", bytes(frame), None)


@st.composite
def truncated(draw):
    _, frame, _ = draw(st.one_of(valid_requests, refused_requests))
    return ("truncated", frame[:draw(st.integers(1, len(frame) - 1))], None)


garbage = st.binary(min_size=1, max_size=12).filter(lambda b: REQUEST_SYNC not in b).map(lambda b: ("garbage", b, None))

actions = st.one_of(valid_requests, valid_requests, refused_requests, corrupted(), truncated(), garbage)


@pytest.mark.slow
@settings(max_examples=FUZZ_SESSIONS, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(st.lists(actions, min_size=1, max_size=8))
def test_every_request_is_answered_and_nothing_refused_moves_the_sequence(session):
    event(f"{len(session)} frames")  # --hypothesis-show-statistics counts them
    run_session(session)


def test_the_fuzzer_catches_a_wrong_answer():
    """The reference is strict: a session whose GENERATE would need a token the model does not
    give fails (here, by asking the reference for one step less than the device runs)."""
    feed = ("request", encode_request(Command.FEED, 1, bytes([3])), (Command.FEED, 1, bytes([3])))
    generate = ("request", encode_request(Command.GENERATE, 2, struct.pack(COUNT_FORMAT, 3)),
                (Command.GENERATE, 2, struct.pack(COUNT_FORMAT, 2)))
    with pytest.raises(AssertionError, match="expected"):
        run_session([feed, generate])
    run_session([feed, ("request", generate[1], (Command.GENERATE, 2, struct.pack(COUNT_FORMAT, 3)))])
