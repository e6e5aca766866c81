"""Check that a board computes what the golden model does: python -m host.selftest --model M

Reads IDENT and checks the model's identity; runs random prompts to the end of the context,
every token against the golden model; sends garbage, a corrupted, a truncated and a refused
frame in the middle of a sequence and checks that the device answers each as the protocol says
and carries on with its sequence intact; prints a table of the steps, passed or failed, and
the tokens per second the host received. Exits non-zero naming the first step that failed.
"""

import argparse
import random
import sys
import time
from dataclasses import dataclass

from int8model.format import ModelError, load
from int8model.golden import Golden
from plan.options import add_model_argument, add_shape_arguments, asked_shape
from wire import Command, Fault

from .backends import BACKENDS, default_backend, open_backend
from .device import DeviceError, IdentityMismatch
from .protocol import encode_request

__all__ = ["Step", "run_selftest", "main"]


@dataclass
class Step:
    name: str
    passed: bool
    detail: str


def golden_tokens(model, prompt, count):
    return [trace.next for trace in Golden(model).generate(prompt, count)]


def expect_fault(device, tag, fault):
    """The device's next reply to ``tag`` is ``ERROR fault``."""
    try:
        kind, payload = device.reply(tag)
    except DeviceError as error:
        if error.fault != fault:
            raise AssertionError(f"expected ERROR {Fault(fault).name}, got ERROR {error}") from None
        return
    raise AssertionError(f"expected ERROR {Fault(fault).name}, got reply {kind:#x} {payload.hex()}")


def _generation(device, model, rng, prompts):
    tokens = 0
    started = time.monotonic()
    for n in range(prompts):
        prompt = [rng.randrange(model.vocab) for _ in range(rng.randrange(1, model.seq_len // 2 + 1))]
        count = model.seq_len - len(prompt) + 1
        device.reset()
        device.feed(prompt)
        got = list(device.generate(count))
        want = golden_tokens(model, prompt, count)
        if got != want:
            first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            raise AssertionError(f"prompt {n} ({len(prompt)} tokens): token {first} is {got[first]}, "
                                 f"the golden model's {want[first]}")
        tokens += count
    seconds = time.monotonic() - started
    return tokens, seconds


def _recovery(device, model, rng):
    """Bad input in the middle of a sequence: each answered as the protocol says, and the
    sequence goes on as if none had been sent."""
    prompt = [rng.randrange(model.vocab) for _ in range(max(2, model.seq_len // 2))]
    first, rest = prompt[:len(prompt) // 2], prompt[len(prompt) // 2:]
    device.reset()
    device.feed(first)
    device.write_raw(bytes(rng.randrange(256) for _ in range(200)))
    device.resync()
    frame = bytearray(encode_request(Command.FEED, 250, bytes(rest)))
    frame[-1] ^= 0x5A
    device.write_raw(frame)
    expect_fault(device, 250, Fault.CRC)
    device.write_raw(encode_request(Command.FEED, 251, bytes(rest))[:5])
    expect_fault(device, 251, Fault.TRUNCATED)
    if model.vocab < 256:
        device.write_raw(encode_request(Command.FEED, 252, bytes([rest[0], model.vocab])))
        expect_fault(device, 252, Fault.TOKEN)
    position = device.stats().pos
    if position != len(first):
        raise AssertionError(f"the position moved from {len(first)} to {position}")
    device.feed(rest)
    count = model.seq_len - len(prompt) + 1
    got, want = list(device.generate(count)), golden_tokens(model, prompt, count)
    if got != want:
        raise AssertionError(f"after the bad input, the sequence differs from the golden model's: {got} != {want}")
    return "garbage, a corrupted, a truncated and a refused frame, then the sequence as the golden model's"


def run_selftest(device, model, *, prompts=4, seed=0):
    """The self-test's steps on ``device`` (a :class:`host.device.Device`) for ``model``: a
    list of :class:`Step` (it stops at the first that fails), and the tokens per second the
    host received while generating (``None`` if it did not get that far)."""
    rng = random.Random(seed)
    steps = []

    def step(name, action):
        try:
            detail = action()
        except (AssertionError, DeviceError, IdentityMismatch, IOError, TimeoutError) as error:
            steps.append(Step(name, False, str(error)))
            return False
        steps.append(Step(name, True, detail))
        return True

    ident = {}

    def read_ident():
        ident["value"] = i = device.ident()
        return (f"d_model {i.d_model}, {i.n_layers} layers, vocab {i.vocab}, context {i.seq_len}; "
                f"{i.lanes} lanes x {i.ways} ways, {i.clock_hz / 1e6:.3f} MHz, {i.baud} baud")

    def identity():
        device.check_model(model)
        return f"sha256 {model.sha256[:16]}..."

    def generation():
        tokens, seconds = _generation(device, model, rng, prompts)
        ident["rate"] = tokens / seconds
        return f"{prompts} random prompts to the end of the context: {tokens} tokens equal the golden model's"

    for name, action in (("ident", read_ident), ("identity", identity), ("generation", generation),
                         ("recovery", lambda: _recovery(device, model, rng))):
        if not step(name, action):
            break
    return steps, ident.get("rate")


def table(steps):
    width = max(len(s.name) for s in steps)
    return "\n".join(f"{s.name:{width}s}  {'pass' if s.passed else 'FAIL'}  {s.detail}" for s in steps)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m host.selftest", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(set(BACKENDS) - {"golden"}),
                        help="the board, or the simulated board (default: the board if one is attached, else sim)")
    add_model_argument(parser)
    parser.add_argument("--port", help="serial port of the board (serial backend; default: the attached ULX3S)")
    parser.add_argument("--prompts", type=int, default=4, help="random prompts run to the end of the context "
                        "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="the prompts' random seed (default: %(default)s)")
    add_shape_arguments(parser, device_help="the simulated board is built as this part's build would be (sim backend)")
    args = parser.parse_args(argv)
    try:
        model = load(args.model)
        print(model.identity_line, file=sys.stderr)
        backend = open_backend(args.backend or default_backend(), model, port=args.port, model_path=args.model,
                               shape=asked_shape(args), device=args.device, check=False)
    except (ModelError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        steps, rate = run_selftest(backend.device, model, prompts=args.prompts, seed=args.seed)
    finally:
        backend.close()
    print(table(steps))
    if rate is not None:
        print(f"tokens received by the host: {rate:.0f} a second, RESET, FEED and GENERATE round trips included"
              + (" (the simulated board runs some ten thousand times slower than the board)"
                 if (args.backend or default_backend()) == "sim" else ""))
    failed = next((s for s in steps if not s.passed), None)
    if failed:
        print(f"error: the self-test failed at step {failed.name}", file=sys.stderr)
        return 1
    print("self-test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
