"""The engine on a device, driven over its serial protocol.

``Device(transport)`` takes anything with pyserial's ``read(n)`` / ``write(data)`` (a
``serial.Serial`` on the board's port, or on the simulated board's pseudo-terminal).
"""

import itertools
import struct

from wire import COUNT_FORMAT, LOAD_HEADER_FORMAT, MAX_PAYLOAD, POSITION_FORMAT, Ident, Stats

from .protocol import Command, Fault, FrameReader, Reply, commit_payload, encode_request, load_payloads

__all__ = ["DeviceError", "Ident", "Stats", "Device", "IdentityMismatch", "NotLoadable", "loadable_plan"]


class DeviceError(Exception):
    """The device refused a command; ``fault`` says why."""

    MESSAGES = {
        Fault.TOKEN: "a token is outside the model's vocab",
        Fault.POSITION: "the command would run past the end of the context (seq_len)",
        Fault.NO_PROMPT: "nothing has been fed since the last reset: generation needs a prompt",
        Fault.COUNT: "cannot generate 0 tokens",
        Fault.CRC: "the device received a corrupted frame (bad CRC)",
        Fault.TRUNCATED: "the device received a truncated frame",
        Fault.UNKNOWN: "the device does not know the command",
        Fault.LENGTH: "the command's payload has the wrong length",
        Fault.NO_MODEL: "the device holds no committed model: load one (docs/loading.md)",
        Fault.LOAD: "the model's bytes did not arrive as sent (CRC-32): load it again",
        Fault.BAKED: "this build's model is baked into its bitstream: it loads none",
        Fault.ADDRESS: "a LOAD chunk for no memory of this build, or past the end of its memory: load again",
    }

    def __init__(self, fault):
        self.fault = Fault(fault)
        super().__init__(f"device error {self.fault.name}: {self.MESSAGES[self.fault]}")


class IdentityMismatch(Exception):
    pass


class Device:
    def __init__(self, transport):
        self.transport = transport
        self.reader = FrameReader(transport.read)
        self._tags = itertools.cycle(range(256))

    def close(self):
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, command, payload=b""):
        tag = next(self._tags)
        self.transport.write(encode_request(command, tag, payload))
        return tag

    def reply(self, tag):
        """The next reply to ``tag``; replies to earlier frames (such as garbage) are skipped."""
        while True:
            kind, reply_tag, payload = self.reader.next()
            if reply_tag != tag:
                continue
            if kind == Reply.ERROR:
                raise DeviceError(payload[0])
            return kind, payload

    def _expect(self, tag, kind):
        got, payload = self.reply(tag)
        if got != kind:
            raise IOError(f"expected a {Reply(kind).name} reply, got {got:#x}")
        return payload

    def write_raw(self, data):
        """Put bytes on the line as they are (for tests of the device's robustness)."""
        self.transport.write(bytes(data))

    def resync(self, attempts=30, wait=1.0):
        """Get the device's attention after garbage on the line.

        Bytes already sent may have left the device inside a frame that swallows the next
        command; the device drops such a frame when the line goes quiet. So: ask for STATS
        with a fresh tag until one is answered, skipping every other reply.
        """
        timeout = self.transport.timeout
        self.transport.timeout = wait
        try:
            for _ in range(attempts):
                tag = self._send(Command.STATS)
                try:
                    while True:
                        kind, reply_tag, _ = self.reader.next()
                        if reply_tag == tag and kind == Reply.STATS:
                            return
                except (TimeoutError, IOError):
                    continue
        finally:
            self.transport.timeout = timeout
        raise TimeoutError(f"the device did not answer after {attempts} attempts")

    def ident(self):
        return Ident.unpack(self._expect(self._send(Command.IDENT), Reply.IDENT))

    def check_model(self, model):
        """Refuse a device built for another model than ``model``."""
        ident = self.ident()
        if ident.sha256 != model.sha256:
            raise IdentityMismatch(
                f"the device runs model sha256 {ident.sha256}, but the model file given is "
                f"sha256 {model.sha256}")
        return ident

    def reset(self):
        self._expect(self._send(Command.RESET), Reply.OK)

    def feed(self, tokens):
        """Run a step for each token (at most MAX_PAYLOAD per frame); returns the position after."""
        tokens = list(tokens)
        pos = None
        for start in range(0, len(tokens), MAX_PAYLOAD):
            payload = bytes(tokens[start:start + MAX_PAYLOAD])
            pos, = struct.unpack(POSITION_FORMAT, self._expect(self._send(Command.FEED, payload), Reply.OK))
        return pos

    def load(self, images, sha256, *, progress=None, attempts=3):
        """Write ``images`` (``{memory: bytes}``) into a loadable device's memories and commit
        them as the model ``sha256``; the device starts a new sequence with it. A chunk the line
        corrupts or cuts is sent again (up to ``attempts`` times); ``progress(sent, total)`` is
        called with the bytes of the images written so far."""
        payloads = list(load_payloads(images))
        total, sent = sum(len(image) for image in images.values()), 0
        for payload in payloads:
            for attempt in range(attempts):
                try:
                    self._expect(self._send(Command.LOAD, payload), Reply.OK)
                    break
                except DeviceError as error:
                    if error.fault not in (Fault.CRC, Fault.TRUNCATED) or attempt + 1 == attempts:
                        raise
            sent += len(payload) - struct.calcsize(LOAD_HEADER_FORMAT)
            if progress:
                progress(sent, total)
        self._expect(self._send(Command.COMMIT, commit_payload(sha256, payloads)), Reply.OK)

    def load_model(self, model, *, progress=None):
        """Load ``model`` into a loadable device: refused before anything is sent where the
        device is a baked build, or ``model`` is of another shape or outside the limits the
        device states (:class:`plan.LimitError`, naming the field, the layer and the limit).
        Returns the bytes of the images sent."""
        from plan.loading import load_images
        images = load_images(loadable_plan(self.ident()), model)
        self.load(images, model.sha256, progress=progress)
        return sum(len(image) for image in images.values())

    def generate(self, count):
        """Yield each generated token as the device makes it."""
        tag = self._send(Command.GENERATE, struct.pack(COUNT_FORMAT, count))
        received = 0
        while received < count:
            # A reply carries every token the device made since the last one.
            tokens = self._expect(tag, Reply.TOKEN)
            if not 0 < len(tokens) <= count - received:
                raise IOError(f"a TOKEN reply of {len(tokens)} tokens, with {count - received} still due")
            received += len(tokens)
            yield from tokens
        self._expect(tag, Reply.OK)

    def stats(self):
        return Stats.unpack(self._expect(self._send(Command.STATS), Reply.STATS))


class NotLoadable(Exception):
    """A baked build, asked to take a model over the line."""


def loadable_plan(ident):
    """The plan of the loadable build ``ident`` describes, as the host needs it for a model's
    images (its shape and limits; attention's rows change no image)."""
    from plan import Limits, Shape, make_loadable_plan
    if not ident.loadable:
        raise NotLoadable(f"the device is a baked build of model sha256 {ident.sha256}: it takes no model over "
                          "the line (build it with --loadable)")
    limits = Limits(ident.d_model, ident.n_heads, ident.d_ff, ident.vocab, ident.seq_len, ident.n_layers,
                    ident.max_nlut, ident.exp_bits, ident.multiplier_bits, ident.embedding_bits, ident.residual_bits,
                    ident.hidden_bits)
    return make_loadable_plan(limits, Shape(lanes=ident.lanes, ways=ident.ways, lut_ways=ident.lut_ways))
