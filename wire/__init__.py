"""What travels on the serial line between a host and the device: the one place both sides read it.

Frames (``docs/protocol.md``): a request ``A5 cmd tag len payload[len] crc``, a reply
``5A type tag len payload[len] crc``, the CRC being CRC-8/AUTOSAR over every byte after the
sync byte. The device (``hdl.protocol``) and the host (``host.protocol``, ``host.device``)
take their numbers and layouts from here.
"""

import enum
import struct
from dataclasses import astuple, dataclass

__all__ = ["REQUEST_SYNC", "REPLY_SYNC", "MAX_PAYLOAD", "DEFAULT_BAUD", "CRC_POLYNOMIAL", "CRC_INITIAL", "CRC_XOR",
           "crc8", "Command", "Reply", "Fault", "Ident", "Stats", "POSITION_FORMAT", "COUNT_FORMAT",
           "LOAD_HEADER_FORMAT", "MAX_LOAD_DATA", "COMMIT_FORMAT"]

REQUEST_SYNC = 0xA5
REPLY_SYNC = 0x5A
MAX_PAYLOAD = 255  # a frame's length byte

# 8N1 at 3 Mbaud: the ULX3S's FT231X takes it, and it is a whole number of clocks a bit at the
# clocks the engine runs at.
DEFAULT_BAUD = 3_000_000

# CRC-8/AUTOSAR: not reflected; check value 0xDF for "123456789".
CRC_POLYNOMIAL = 0x2F
CRC_INITIAL = 0xFF
CRC_XOR = 0xFF


def crc8(data):
    """CRC-8/AUTOSAR of ``data``, bit by bit as its definition reads (the device uses
    Amaranth's CRC catalogue: tests/test_board.py holds the two to the check value)."""
    crc = CRC_INITIAL
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ CRC_POLYNOMIAL) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc ^ CRC_XOR


class Command(enum.IntEnum):
    IDENT = 0x01     # no payload
    RESET = 0x02     # no payload
    FEED = 0x03      # 1 to 255 prompt tokens
    GENERATE = 0x04  # a count (COUNT_FORMAT)
    STATS = 0x05     # no payload
    LOAD = 0x06      # a chunk of a memory's bytes: LOAD_HEADER_FORMAT, then 1 to MAX_LOAD_DATA bytes
    COMMIT = 0x07    # the loaded model's sha256 (32 bytes) and the CRC-32 of every LOAD payload (u32)


class Reply(enum.IntEnum):
    OK = 0x80        # the position of the next step (POSITION_FORMAT)
    IDENT = 0x81     # an Ident
    TOKEN = 0x82     # the tokens generated since the last TOKEN reply (1 to 255)
    STATS = 0x83     # a Stats
    ERROR = 0xE0     # a Fault (one byte)


class Fault(enum.IntEnum):
    TOKEN = 1        # a token outside the vocab
    POSITION = 2     # the command would run past seq_len
    NO_PROMPT = 3    # GENERATE with nothing fed since RESET
    COUNT = 4        # GENERATE 0
    CRC = 5          # the frame's CRC does not match
    TRUNCATED = 6    # the line went quiet in the middle of a frame
    UNKNOWN = 7      # an unknown command
    LENGTH = 8       # a payload length the command does not take
    NO_MODEL = 9     # FEED or GENERATE before a load is committed
    LOAD = 10        # COMMIT whose CRC-32 is not the device's over what it took: load again
    BAKED = 11       # LOAD or COMMIT to a build whose model is baked in
    ADDRESS = 12     # LOAD to no memory, or past the end of its memory's image: the load is abandoned


POSITION_FORMAT = "<H"
COUNT_FORMAT = "<H"
# A LOAD's header: the memory (docs/loading.md) and the byte address of the chunk's first byte
# in that memory's image (24 bits: the low 16 as "<H", then the high 8).
LOAD_HEADER_FORMAT = "<BHB"
MAX_LOAD_DATA = MAX_PAYLOAD - struct.calcsize(LOAD_HEADER_FORMAT)
COMMIT_FORMAT = "<32sI"


@dataclass(frozen=True)
class Ident:
    """IDENT's reply: the model's identity and shape, and how the device was built."""
    sha256: str    # 64 hex digits
    d_model: int
    n_heads: int
    d_ff: int
    vocab: int
    seq_len: int
    n_layers: int
    lanes: int
    clock_hz: int
    baud: int
    ways: int      # elements a cycle between the units: MAC multipliers = lanes × ways
    lut_ways: int  # of them, built from LUTs
    # A loadable build's limits (plan.limits.Limits; all 0 for a baked build): the sha256 is
    # then the committed model's (zeros before the first commit).
    loadable: int = 0
    max_nlut: int = 0
    exp_bits: int = 0
    multiplier_bits: int = 0
    embedding_bits: int = 0
    residual_bits: int = 0
    hidden_bits: int = 0

    FORMAT = "<32s7H2I2BBH5B"

    def pack(self):
        fields = list(astuple(self))
        fields[0] = bytes.fromhex(self.sha256)
        return struct.pack(self.FORMAT, *fields)

    @classmethod
    def unpack(cls, payload):
        sha256, *fields = struct.unpack(cls.FORMAT, payload)
        return cls(sha256.hex(), *fields)

    @classmethod
    def size(cls):
        return struct.calcsize(cls.FORMAT)


@dataclass(frozen=True)
class Stats:
    """STATS' reply."""
    cycles: int   # cycles of the last decode step
    pos: int      # position of the next step (= tokens in the sequence so far)
    steps: int    # steps since RESET

    FORMAT = "<IHI"

    def pack(self):
        return struct.pack(self.FORMAT, *astuple(self))

    @classmethod
    def unpack(cls, payload):
        return cls(*struct.unpack(cls.FORMAT, payload))
