"""The command protocol between the host and the engine, spoken over the UART's byte streams.

Frames (documented in ``docs/protocol.md``; their numbers and layouts in :mod:`wire`, the host's
side in ``host/protocol.py``):

* request: ``A5 cmd tag len payload[len] crc``
* reply:   ``5A type tag len payload[len] crc``

``crc`` is CRC-8/AUTOSAR over every byte after the sync byte. ``tag`` is the host's, echoed.
"""

import struct

from amaranth.hdl import Array, Const, Module, Mux, Signal
from amaranth.lib import crc, data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from wire import (COMMIT_FORMAT, LOAD_HEADER_FORMAT, MAX_PAYLOAD, POSITION_FORMAT, REPLY_SYNC, REQUEST_SYNC, Command,
                  Fault, Reply, Stats)

from .fifo import StreamFIFO
from .interface import EngineControl, Error as EngineError, Op

__all__ = ["CommandProtocol", "load_layout"]

FROM_ENGINE = {EngineError.TOKEN: Fault.TOKEN, EngineError.POSITION: Fault.POSITION,
               EngineError.NO_PROMPT: Fault.NO_PROMPT, EngineError.COUNT: Fault.COUNT}

CRC8 = crc.catalog.CRC8_AUTOSAR
CRC32 = crc.catalog.CRC32_ISO_HDLC  # zlib's: the host's check of a load
LOAD_HEADER = struct.calcsize(LOAD_HEADER_FORMAT)
SHA256_BYTES = 32


def load_layout():
    """A byte of a load on its way to a memory: the memory, the byte's address in its image."""
    return data.StructLayout({"memory": 8, "address": 24, "data": 8})


class CommandProtocol(wiring.Component):
    """Parses request frames from the UART, runs them on the engine, and frames the replies.

    A frame is acted on only once its CRC has checked, and a ``FEED`` is checked whole (every
    token in the vocab, room in the cache) before its first token runs, so a rejected command
    leaves the sequence exactly as it was. Outside a frame, bytes other than the sync byte are
    skipped; a frame whose bytes stop for ``timeout`` cycles is answered ``TRUNCATED`` and
    dropped. Bytes that arrive while a command runs are dropped: one command at a time.

    Generated tokens wait in a queue as deep as the context, so the engine never waits for
    the line; each ``TOKEN`` reply carries every token queued when it starts (up to 255), so
    the line carries about a byte per token once the engine outpaces it.

    Parameters
    ----------
    seq_len, vocab : int
        The model's.
    ident : bytes
        IDENT's reply (a :class:`wire.Ident`, packed).
    timeout : int
        Cycles of silence inside a frame after which it is dropped as truncated.
    load_sizes : tuple of int or None
        A loadable build's memories, the bytes of each one's image by its index on the line
        (:func:`plan.loading.load_targets`); ``None`` for a baked build, which answers ``LOAD``
        and ``COMMIT`` ``BAKED`` (docs/loading.md). ``FEED`` and ``GENERATE`` are refused
        ``NO_MODEL`` from the first ``LOAD`` until a ``COMMIT`` whose CRC-32 equals the
        device's own over every ``LOAD`` payload it took since the last commit or ``RESET``;
        a commit starts a new sequence and IDENT reports its identity. A chunk for no memory,
        or reaching past its memory's image, writes nothing and abandons the load.
    holds_model : bool
        A loadable build's state at power-up: whether its memories start with the model whose
        identity ``ident`` carries (else it refuses to run until a load).

    Ports
    -----
    rx : ``In(stream.Signature(8))``, bytes from the host.
    tx : ``Out(stream.Signature(8))``, bytes to the host.
    engine : ``Out(EngineControl(seq_len))``, the engine's control.
    load : ``Out(stream.Signature(load_layout()))``, a loadable build's bytes to its memories.
    listening : ``Out(1)``, whether a byte on ``rx`` this cycle is taken into a frame (or
        looked at for a sync byte): bytes offered while it is low are dropped.
    idle : ``Out(1)``, between frames: nothing received, running or replying.
    """

    MAX_PAYLOAD = MAX_PAYLOAD

    def __init__(self, *, seq_len, vocab, ident, timeout, load_sizes=None, holds_model=True):
        self.seq_len, self.vocab, self.ident, self.timeout = seq_len, vocab, bytes(ident), timeout
        self.load_sizes = None if load_sizes is None else tuple(load_sizes)
        self.loadable, self.holds_model = load_sizes is not None, holds_model
        ports = {
            "rx": In(stream.Signature(8)),
            "tx": Out(stream.Signature(8)),
            "engine": Out(EngineControl(seq_len)),
            "listening": Out(1),
            "idle": Out(1),
        }
        if self.loadable:
            ports["load"] = Out(stream.Signature(load_layout()))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        seq_len, vocab = self.seq_len, self.vocab
        engine = self.engine

        # -- Receiving a frame.
        m.submodules.rx_crc = rx_crc = CRC8(data_width=8).create()
        m.submodules.buffer = buffer = memory.Memory(shape=8, depth=self.MAX_PAYLOAD, init=[],
                                                     attrs={"ram_style": "distributed"})
        buffer_write = buffer.write_port()
        buffer_read = buffer.read_port(domain="comb")
        command = Signal(8)
        tag = Signal(8)
        length = Signal(8)
        received = Signal(8)
        bad_token = Signal()
        quiet = Signal(range(self.timeout + 1))
        m.d.comb += buffer_read.addr.eq(received)
        byte = self.rx.payload
        got = Signal()
        # Every state takes bytes: outside a frame's states they are dropped, so the receiver
        # never overruns while a command runs.
        m.d.comb += [self.rx.ready.eq(1), got.eq(self.rx.valid)]
        m.d.comb += [rx_crc.data.eq(byte), buffer_write.addr.eq(received), buffer_write.data.eq(byte)]

        # -- Replying.
        m.submodules.tx_crc = tx_crc = CRC8(data_width=8).create()
        reply_type = Signal(8)
        reply_length = Signal(8)
        sent = Signal(8)
        fault = Signal(8)
        stats = Signal(80)
        # Generated tokens, queued until a reply carries them.
        m.submodules.pending = pending = StreamFIFO(8, seq_len + 1)
        wiring.connect(m, wiring.flipped(engine.tokens), pending.i)
        m.submodules.ident = ident_rom = memory.Memory(shape=8, depth=len(self.ident), init=self.ident,
                                                       attrs={"rom_style": "logic", "ram_style": "logic"})
        ident_read = ident_rom.read_port(domain="comb")
        m.d.comb += ident_read.addr.eq(sent)
        ident_byte = ident_read.data
        # A loadable build's identity is the last committed model's.
        loaded = Signal(init=int(self.holds_model or not self.loadable))  # FEED and GENERATE may run
        loading = Signal()           # a LOAD was taken since the last commit or RESET
        if self.loadable:
            m.submodules.load_crc = load_crc = CRC32(data_width=8).create()
            m.submodules.identity = identity = memory.Memory(
                shape=8, depth=SHA256_BYTES, init=self.ident[:SHA256_BYTES], attrs={"ram_style": "distributed"})
            identity_write = identity.write_port()
            identity_read = identity.read_port(domain="comb")
            m.d.comb += [identity_read.addr.eq(sent), identity_write.addr.eq(received),
                         identity_write.data.eq(buffer_read.data), load_crc.data.eq(buffer_read.data)]
            ident_byte = Mux(sent < SHA256_BYTES, identity_read.data, ident_read.data)
            load_memory = Signal(8)
            load_address = Signal(24)
            load_end, load_size, load_known = Signal(25), Signal(25), Signal()  # the chunk's, for its check
            commit_mismatch = Signal()
            m.d.comb += [self.load.payload.memory.eq(load_memory), self.load.payload.address.eq(load_address),
                         self.load.payload.data.eq(buffer_read.data)]
        pos_bytes = Signal(16)
        m.d.comb += pos_bytes.eq(engine.status.pos)
        payload_byte = Signal(8)
        with m.Switch(reply_type):
            with m.Case(Reply.OK):
                m.d.comb += payload_byte.eq(pos_bytes.word_select(sent[0], 8))
            with m.Case(Reply.IDENT):
                m.d.comb += payload_byte.eq(ident_byte)
            with m.Case(Reply.TOKEN):
                m.d.comb += payload_byte.eq(pending.o.payload)
            with m.Case(Reply.STATS):
                m.d.comb += payload_byte.eq(Array(stats.word_select(i, 8) for i in range(10))[sent])
            with m.Case(Reply.ERROR):
                m.d.comb += payload_byte.eq(fault)
        reply_lengths = {Reply.OK: struct.calcsize(POSITION_FORMAT), Reply.IDENT: len(self.ident),
                         Reply.STATS: struct.calcsize(Stats.FORMAT), Reply.ERROR: 1}

        def reply(kind, then, length=None):
            m.d.sync += [reply_type.eq(kind), reply_length.eq(reply_lengths[kind] if length is None else length),
                         sent.eq(0)]
            m.next = f"SEND_SYNC_{then}"

        def fail(code):
            m.d.sync += fault.eq(code)
            reply(Reply.ERROR, "HUNT")

        def sender(then):
            """States that send the reply frame set up by `reply`, then go to `then`."""
            with m.State(f"SEND_SYNC_{then}"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(REPLY_SYNC)]
                with m.If(self.tx.ready):
                    m.d.comb += tx_crc.start.eq(1)
                    m.next = f"SEND_TYPE_{then}"
            for name, value, following in (("TYPE", reply_type, "TAG"), ("TAG", tag, "LEN"),
                                           ("LEN", reply_length, "PAYLOAD")):
                with m.State(f"SEND_{name}_{then}"):
                    m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(value),
                                 tx_crc.data.eq(value), tx_crc.valid.eq(self.tx.ready)]
                    with m.If(self.tx.ready):
                        m.next = f"SEND_{following}_{then}"
            with m.State(f"SEND_PAYLOAD_{then}"):
                with m.If(sent == reply_length):
                    m.next = f"SEND_CRC_{then}"
                with m.Else():
                    m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(payload_byte),
                                 tx_crc.data.eq(payload_byte), tx_crc.valid.eq(self.tx.ready)]
                    with m.If(self.tx.ready):
                        m.d.sync += sent.eq(sent + 1)
                        if then == "GENERATE_TOKENS":  # a TOKEN reply's bytes leave the queue
                            m.d.comb += pending.o.ready.eq(1)
            with m.State(f"SEND_CRC_{then}"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(tx_crc.crc)]
                with m.If(self.tx.ready):
                    m.next = then

        def loading_states():
            """LOAD: the header, then each byte to the memories; every payload byte into the
            CRC-32. COMMIT: the host's CRC-32 against the device's, then the identity."""
            with m.State("LOAD_HEADER"):
                m.d.comb += load_crc.valid.eq(1)
                m.d.sync += received.eq(received + 1)
                with m.Switch(received):
                    with m.Case(0):
                        m.d.sync += load_memory.eq(buffer_read.data)
                    for n in range(LOAD_HEADER - 1):
                        with m.Case(n + 1):
                            m.d.sync += load_address.word_select(n, 8).eq(buffer_read.data)
                with m.If(received == LOAD_HEADER - 1):
                    m.next = "LOAD_RANGE"
            with m.State("LOAD_RANGE"):
                # Checked before a byte is written: a chunk lands whole inside its memory's image.
                sizes = Array(Const(size, 25) for size in self.load_sizes)
                m.d.sync += [load_end.eq(load_address + (length - LOAD_HEADER)), load_size.eq(sizes[load_memory]),
                             load_known.eq(load_memory < len(self.load_sizes))]
                m.next = "LOAD_CHECK"
            with m.State("LOAD_CHECK"):
                with m.If(load_known & (load_end <= load_size)):
                    m.next = "LOAD_DATA"
                with m.Else():
                    m.d.comb += load_crc.start.eq(1)
                    m.d.sync += loading.eq(0)
                    fail(Fault.ADDRESS)
            with m.State("LOAD_DATA"):
                with m.If(received == length):
                    reply(Reply.OK, "HUNT")
                with m.Else():
                    m.d.comb += self.load.valid.eq(1)
                    with m.If(self.load.ready):
                        m.d.comb += load_crc.valid.eq(1)
                        m.d.sync += [received.eq(received + 1), load_address.eq(load_address + 1)]
            with m.State("COMMIT_CHECK"):
                # The payload: the sha256, then the host's CRC-32, little-endian.
                crc_bytes = Array(load_crc.crc.word_select(n, 8) for n in range(4))
                with m.If((received >= SHA256_BYTES) & (buffer_read.data != crc_bytes[received[:2]])):
                    m.d.sync += commit_mismatch.eq(1)
                m.d.sync += received.eq(received + 1)
                with m.If(received == length - 1):
                    m.next = "COMMIT_DECIDE"
            with m.State("COMMIT_DECIDE"):
                m.d.sync += received.eq(0)
                with m.If(commit_mismatch):
                    m.d.comb += load_crc.start.eq(1)
                    m.d.sync += loading.eq(0)   # what the memories hold is unknown: load again
                    fail(Fault.LOAD)
                with m.Else():
                    m.next = "COMMIT_IDENTITY"
            with m.State("COMMIT_IDENTITY"):
                m.d.comb += identity_write.en.eq(1)
                m.d.sync += received.eq(received + 1)
                with m.If(received == SHA256_BYTES - 1):
                    m.d.sync += loaded.eq(1)
                    m.next = "RESET"   # a new model, a new sequence; RESET ends the load

        in_frame = Signal()
        m.d.sync += quiet.eq(Mux(got | ~in_frame, 0, quiet + 1))
        timed_out = quiet == self.timeout

        op = engine.cmd.payload.op
        # The command's argument (a FEED's token, a GENERATE's count) is always this register,
        # never a choice by state: the engine judges it as it takes the command.
        arg = Signal(16)
        m.d.comb += engine.cmd.payload.arg.eq(arg)
        with m.FSM():
            with m.State("HUNT"):
                m.d.comb += [self.listening.eq(1), self.idle.eq(1)]
                with m.If(got & (byte == REQUEST_SYNC)):
                    m.d.comb += rx_crc.start.eq(1)
                    m.d.sync += [in_frame.eq(1), received.eq(0), bad_token.eq(0)]
                    m.next = "COMMAND"
            for name, target, following in (("COMMAND", command, "TAG"), ("TAG", tag, "LENGTH")):
                with m.State(name):
                    m.d.comb += [rx_crc.valid.eq(got), self.listening.eq(1)]
                    with m.If(got):
                        m.d.sync += target.eq(byte)
                        m.next = following
                    with m.Elif(timed_out):
                        m.d.sync += in_frame.eq(0)
                        fail(Fault.TRUNCATED)
            with m.State("LENGTH"):
                m.d.comb += [rx_crc.valid.eq(got), self.listening.eq(1)]
                with m.If(got):
                    m.d.sync += length.eq(byte)
                    m.next = "PAYLOAD"
                with m.Elif(timed_out):
                    m.d.sync += in_frame.eq(0)
                    fail(Fault.TRUNCATED)
            with m.State("PAYLOAD"):
                with m.If(received == length):
                    m.next = "CHECK"
                with m.Else():
                    m.d.comb += [rx_crc.valid.eq(got), buffer_write.en.eq(got), self.listening.eq(1)]
                    with m.If(got):
                        m.d.sync += received.eq(received + 1)
                        if vocab < 256:
                            with m.If(byte >= vocab):
                                m.d.sync += bad_token.eq(1)
                    with m.Elif(timed_out):
                        m.d.sync += in_frame.eq(0)
                        fail(Fault.TRUNCATED)
            with m.State("CHECK"):
                m.d.comb += self.listening.eq(1)
                with m.If(got):
                    m.d.sync += in_frame.eq(0)
                    with m.If(byte != rx_crc.crc):
                        fail(Fault.CRC)
                    with m.Else():
                        m.next = "DISPATCH"
                with m.Elif(timed_out):
                    m.d.sync += in_frame.eq(0)
                    fail(Fault.TRUNCATED)

            with m.State("DISPATCH"):
                m.d.sync += received.eq(0)
                # Every command, and the payload lengths it takes.
                known = Signal()
                length_ok = Signal()
                with m.Switch(command):
                    for name, ok in ((Command.IDENT, length == 0), (Command.RESET, length == 0),
                                     (Command.STATS, length == 0), (Command.FEED, length != 0),
                                     (Command.GENERATE, length == 2), (Command.LOAD, length > LOAD_HEADER),
                                     (Command.COMMIT, length == struct.calcsize(COMMIT_FORMAT))):
                        with m.Case(name):
                            m.d.comb += [known.eq(1), length_ok.eq(ok)]
                with m.If(~known):
                    fail(Fault.UNKNOWN)
                with m.Elif(~length_ok):
                    fail(Fault.LENGTH)
                with m.Else():
                    with m.Switch(command):
                        with m.Case(Command.IDENT):
                            reply(Reply.IDENT, "HUNT")
                        with m.Case(Command.RESET):
                            m.next = "RESET"
                        with m.Case(Command.STATS):
                            # As wire.Stats packs them: cycles (u32), position (u16), steps (u32).
                            m.d.sync += stats.eq(Const(0, 80) | engine.status.cycles
                                                 | (engine.status.pos << 32) | (engine.status.steps << 48))
                            reply(Reply.STATS, "HUNT")
                        with m.Case(Command.LOAD, Command.COMMIT):
                            if not self.loadable:
                                fail(Fault.BAKED)
                            else:
                                with m.If(command == Command.LOAD):
                                    m.d.sync += [loaded.eq(0), loading.eq(1)]
                                    m.next = "LOAD_HEADER"
                                with m.Elif(~loading):  # nothing loaded to commit
                                    fail(Fault.LOAD)
                                with m.Else():
                                    m.d.sync += commit_mismatch.eq(0)
                                    m.next = "COMMIT_CHECK"
                        with m.Case(Command.FEED, Command.GENERATE):
                            with m.If(~loaded):
                                fail(Fault.NO_MODEL)
                            with m.Elif(command == Command.GENERATE):
                                m.next = "GENERATE_COUNT"
                            with m.Elif(bad_token):
                                fail(Fault.TOKEN)
                            with m.Elif(engine.status.pos + length > seq_len):
                                fail(Fault.POSITION)
                            with m.Else():
                                m.next = "FEED"
            with m.State("RESET"):
                if self.loadable:  # a load in progress is abandoned: only a whole one commits
                    m.d.comb += load_crc.start.eq(1)
                    m.d.sync += loading.eq(0)
                m.d.comb += [engine.cmd.valid.eq(1), op.eq(Op.NEW)]
                with m.If(engine.cmd.ready):
                    m.next = "SETTLE_OK"
            with m.State("FEED"):
                m.d.sync += [arg.eq(buffer_read.data), received.eq(received + 1)]
                m.next = "FEED_OFFER"
            with m.State("FEED_OFFER"):
                # Only the frame's last token needs its next token (for GENERATE): the others
                # are prefill steps, which make only their cache row.
                m.d.comb += [engine.cmd.valid.eq(1), op.eq(Mux(received == length, Op.FEED, Op.PREFILL))]
                with m.If(engine.cmd.ready):
                    m.next = "FEED_WAIT"
            with m.State("FEED_WAIT"):
                with m.If(~engine.status.busy & (received == length)):
                    m.next = "SETTLE_OK"
                with m.Elif(~engine.status.busy):
                    m.next = "FEED"
            with m.State("SETTLE_OK"):
                with m.If(~engine.status.busy):
                    reply(Reply.OK, "HUNT")
            with m.State("GENERATE_COUNT"):
                # The count is little-endian: byte 0 now (`received` is 0), byte 1 next.
                m.d.sync += [arg[:8].eq(buffer_read.data), received.eq(1)]
                m.next = "GENERATE_COUNT_HIGH"
            with m.State("GENERATE_COUNT_HIGH"):
                m.d.sync += arg[8:].eq(buffer_read.data)
                m.next = "GENERATE_CHECK"
            with m.State("GENERATE_CHECK"):
                with m.If(arg > seq_len):
                    fail(Fault.POSITION)
                with m.Else():
                    m.next = "GENERATE"
            with m.State("GENERATE"):
                m.d.comb += [engine.cmd.valid.eq(1), op.eq(Op.GENERATE)]
                with m.If(engine.cmd.ready):
                    m.next = "GENERATE_TOKENS"
            with m.State("GENERATE_TOKENS"):
                # The engine is busy from the command's acceptance until its last token is
                # queued; a command it refuses ends with its error set and no token.
                errors = Array(Const(FROM_ENGINE.get(e, 0), 8) for e in EngineError)
                with m.If(pending.level != 0):
                    reply(Reply.TOKEN, "GENERATE_TOKENS",
                          length=Mux(pending.level > self.MAX_PAYLOAD, self.MAX_PAYLOAD, pending.level))
                with m.Elif(~engine.status.busy):
                    with m.If(engine.status.error != EngineError.NONE):
                        fail(errors[engine.status.error])
                    with m.Else():
                        reply(Reply.OK, "HUNT")
            if self.loadable:
                loading_states()
            sender("HUNT")
            sender("GENERATE_TOKENS")
        return m
