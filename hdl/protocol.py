"""The command protocol between the host and the engine, spoken over the UART's byte streams.

Frames (documented in ``docs/protocol.md``, implemented for the host in ``host/protocol.py``):

* request: ``A5 cmd tag len payload[len] crc``
* reply:   ``5A type tag len payload[len] crc``

``crc`` is CRC-8/AUTOSAR over every byte after the sync byte. ``tag`` is the host's, echoed.
"""

import enum

from amaranth.hdl import Array, Const, Module, Mux, Signal
from amaranth.lib import crc, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .engine import Error as EngineError, Op, command_layout, status_layout

__all__ = ["Command", "Reply", "Fault", "REQUEST_SYNC", "REPLY_SYNC", "CommandProtocol", "ident_payload"]

REQUEST_SYNC = 0xA5
REPLY_SYNC = 0x5A


class Command(enum.IntEnum):
    IDENT = 0x01
    RESET = 0x02
    FEED = 0x03
    GENERATE = 0x04
    STATS = 0x05


class Reply(enum.IntEnum):
    OK = 0x80        # payload: position (u16)
    IDENT = 0x81     # payload: see ident_payload
    TOKEN = 0x82     # payload: the tokens generated since the last TOKEN reply (1 to 255)
    STATS = 0x83     # payload: cycles of the last step (u32), position (u16), steps (u32)
    ERROR = 0xE0     # payload: a Fault


class Fault(enum.IntEnum):
    TOKEN = 1        # a token outside the vocab
    POSITION = 2     # the command would run past seq_len
    NO_PROMPT = 3    # GENERATE with nothing fed since RESET
    COUNT = 4        # GENERATE 0
    CRC = 5          # the frame's CRC does not match
    TRUNCATED = 6    # the line went quiet in the middle of a frame
    UNKNOWN = 7      # an unknown command
    LENGTH = 8       # a payload length the command does not take


FROM_ENGINE = {EngineError.TOKEN: Fault.TOKEN, EngineError.POSITION: Fault.POSITION,
               EngineError.NO_PROMPT: Fault.NO_PROMPT, EngineError.COUNT: Fault.COUNT}

CRC8 = crc.catalog.CRC8_AUTOSAR


def ident_payload(model, lanes, clock_hz, baud, ways, lut_ways):
    """IDENT's payload: sha256 (32 bytes), d_model, n_heads, d_ff, vocab, seq_len (u16 each),
    lanes (u16), clock in Hz (u32), baud (u32), ways and LUT ways (u8 each)."""
    out = bytes.fromhex(model.sha256)
    for value in (model.d_model, model.n_heads, model.d_ff, model.vocab, model.seq_len, lanes):
        out += value.to_bytes(2, "little")
    out += int(clock_hz).to_bytes(4, "little") + int(baud).to_bytes(4, "little")
    return out + bytes([ways, lut_ways])


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

    Ports
    -----
    rx : ``In(stream.Signature(8))``, bytes from the host.
    tx : ``Out(stream.Signature(8))``, bytes to the host.
    cmd, tokens, status : the engine's ports, seen from the other side.
    """

    MAX_PAYLOAD = 255

    def __init__(self, model, *, ident, timeout):
        self.model, self.ident, self.timeout = model, bytes(ident), timeout
        super().__init__({
            "rx": In(stream.Signature(8)),
            "tx": Out(stream.Signature(8)),
            "cmd": Out(stream.Signature(command_layout(model.seq_len))),
            "tokens": In(stream.Signature(8)),
            "status": In(status_layout(model.seq_len)),
        })

    def elaborate(self, platform):
        m = Module()
        model = self.model
        seq_len, vocab = model.seq_len, model.vocab

        # -- Receiving a frame.
        m.submodules.rx_crc = rx_crc = CRC8(data_width=8).create()
        m.submodules.buffer = buffer = memory.Memory(shape=8, depth=self.MAX_PAYLOAD, init=[])
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
        token = Signal(8)
        stats = Signal(80)
        # Generated tokens, queued until a reply carries them.
        m.submodules.pending = pending = fifo.SyncFIFO(width=8, depth=seq_len + 1)
        m.d.comb += [
            pending.w_data.eq(self.tokens.payload),
            pending.w_en.eq(self.tokens.valid),
            self.tokens.ready.eq(pending.w_rdy),
        ]
        m.submodules.ident = ident_rom = memory.Memory(shape=8, depth=len(self.ident), init=self.ident)
        ident_read = ident_rom.read_port(domain="comb")
        m.d.comb += ident_read.addr.eq(sent)
        pos_bytes = Signal(16)
        m.d.comb += pos_bytes.eq(self.status.pos)
        payload_byte = Signal(8)
        with m.Switch(reply_type):
            with m.Case(Reply.OK):
                m.d.comb += payload_byte.eq(pos_bytes.word_select(sent[0], 8))
            with m.Case(Reply.IDENT):
                m.d.comb += payload_byte.eq(ident_read.data)
            with m.Case(Reply.TOKEN):
                m.d.comb += payload_byte.eq(pending.r_data)
            with m.Case(Reply.STATS):
                m.d.comb += payload_byte.eq(Array(stats.word_select(i, 8) for i in range(10))[sent])
            with m.Case(Reply.ERROR):
                m.d.comb += payload_byte.eq(fault)
        reply_lengths = {Reply.OK: 2, Reply.IDENT: len(self.ident), Reply.STATS: 10, Reply.ERROR: 1}

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
                            m.d.comb += pending.r_en.eq(1)
            with m.State(f"SEND_CRC_{then}"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(tx_crc.crc)]
                with m.If(self.tx.ready):
                    m.next = then

        in_frame = Signal()
        m.d.sync += quiet.eq(Mux(got | ~in_frame, 0, quiet + 1))
        timed_out = quiet == self.timeout

        op, arg = self.cmd.payload.op, self.cmd.payload.arg
        count = Signal(16)
        with m.FSM():
            with m.State("HUNT"):
                with m.If(got & (byte == REQUEST_SYNC)):
                    m.d.comb += rx_crc.start.eq(1)
                    m.d.sync += [in_frame.eq(1), received.eq(0), bad_token.eq(0)]
                    m.next = "COMMAND"
            for name, target, following in (("COMMAND", command, "TAG"), ("TAG", tag, "LENGTH")):
                with m.State(name):
                    m.d.comb += [rx_crc.valid.eq(got)]
                    with m.If(got):
                        m.d.sync += target.eq(byte)
                        m.next = following
                    with m.Elif(timed_out):
                        m.d.sync += in_frame.eq(0)
                        fail(Fault.TRUNCATED)
            with m.State("LENGTH"):
                m.d.comb += [rx_crc.valid.eq(got)]
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
                    m.d.comb += [rx_crc.valid.eq(got), buffer_write.en.eq(got)]
                    with m.If(got):
                        m.d.sync += received.eq(received + 1)
                        if vocab < 256:
                            with m.If(byte >= vocab):
                                m.d.sync += bad_token.eq(1)
                    with m.Elif(timed_out):
                        m.d.sync += in_frame.eq(0)
                        fail(Fault.TRUNCATED)
            with m.State("CHECK"):
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
                                     (Command.GENERATE, length == 2)):
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
                            m.d.sync += stats.eq(Const(0, 80) | self.status.cycles
                                                 | (self.status.pos << 32) | (self.status.steps << 48))
                            reply(Reply.STATS, "HUNT")
                        with m.Case(Command.FEED):
                            with m.If(bad_token):
                                fail(Fault.TOKEN)
                            with m.Elif(self.status.pos + length > seq_len):
                                fail(Fault.POSITION)
                            with m.Else():
                                m.next = "FEED"
                        with m.Case(Command.GENERATE):
                            m.next = "GENERATE_COUNT"
            with m.State("RESET"):
                m.d.comb += [self.cmd.valid.eq(1), op.eq(Op.NEW)]
                with m.If(self.cmd.ready):
                    m.next = "SETTLE_OK"
            with m.State("FEED"):
                # The token goes through a register: the engine judges it in the same cycle.
                m.d.sync += [token.eq(buffer_read.data), received.eq(received + 1)]
                m.next = "FEED_OFFER"
            with m.State("FEED_OFFER"):
                # Only the frame's last token needs its next token (for GENERATE): the others
                # are prefill steps, which make only their cache row.
                m.d.comb += [self.cmd.valid.eq(1), op.eq(Mux(received == length, Op.FEED, Op.PREFILL)),
                             arg.eq(token)]
                with m.If(self.cmd.ready):
                    m.next = "FEED_WAIT"
            with m.State("FEED_WAIT"):
                with m.If(~self.status.busy & (received == length)):
                    m.next = "SETTLE_OK"
                with m.Elif(~self.status.busy):
                    m.next = "FEED"
            with m.State("SETTLE_OK"):
                with m.If(~self.status.busy):
                    reply(Reply.OK, "HUNT")
            with m.State("GENERATE_COUNT"):
                # The count is little-endian: byte 0 now (`received` is 0), byte 1 next.
                m.d.sync += [count[:8].eq(buffer_read.data), received.eq(1)]
                m.next = "GENERATE_COUNT_HIGH"
            with m.State("GENERATE_COUNT_HIGH"):
                m.d.sync += count[8:].eq(buffer_read.data)
                m.next = "GENERATE_CHECK"
            with m.State("GENERATE_CHECK"):
                with m.If(count > seq_len):
                    fail(Fault.POSITION)
                with m.Else():
                    m.next = "GENERATE"
            with m.State("GENERATE"):
                m.d.comb += [self.cmd.valid.eq(1), op.eq(Op.GENERATE),
                             arg.eq(count)]
                with m.If(self.cmd.ready):
                    m.next = "GENERATE_TOKENS"
            with m.State("GENERATE_TOKENS"):
                # The engine is busy from the command's acceptance until its last token is
                # queued; a command it refuses ends with its error set and no token.
                errors = Array(Const(FROM_ENGINE.get(e, 0), 8) for e in EngineError)
                with m.If(pending.level != 0):
                    reply(Reply.TOKEN, "GENERATE_TOKENS",
                          length=Mux(pending.level > self.MAX_PAYLOAD, self.MAX_PAYLOAD, pending.level))
                with m.Elif(~self.status.busy):
                    with m.If(self.status.error != EngineError.NONE):
                        fail(errors[self.status.error])
                    with m.Else():
                        reply(Reply.OK, "HUNT")
            sender("HUNT")
            sender("GENERATE_TOKENS")
        return m
