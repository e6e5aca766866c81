"""The host's side of the command protocol: framing and CRC, written independently of the HDL.

Request ``A5 cmd tag len payload crc``, reply ``5A type tag len payload crc``; the CRC is
CRC-8/AUTOSAR (polynomial 0x2F, initial 0xFF, final XOR 0xFF) over the bytes after the sync,
computed by :func:`wire.crc8`. The numbers of commands, replies and faults are the ones the
device is built with (:mod:`wire`).
"""

import struct
import zlib

from wire import (COMMIT_FORMAT, LOAD_HEADER_FORMAT, MAX_LOAD_DATA, MAX_PAYLOAD, REPLY_SYNC, REQUEST_SYNC, Command,
                  Fault, Reply, crc8)

__all__ = ["crc8", "encode_request", "load_payloads", "commit_payload", "FrameReader", "Command", "Reply", "Fault"]


def encode_request(command, tag, payload=b""):
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a frame carries at most {MAX_PAYLOAD} payload bytes, not {len(payload)}")
    body = bytes([command, tag, len(payload)]) + bytes(payload)
    return bytes([REQUEST_SYNC]) + body + bytes([crc8(body)])


def load_payloads(images, chunk=MAX_LOAD_DATA):
    """The LOAD payloads that write ``images`` (``{memory: bytes}``), each image in chunks of
    ``chunk`` bytes from address 0."""
    for memory, image in images.items():
        if len(image) > 1 << 24:
            raise ValueError(f"memory {memory}'s image has {len(image)} bytes; a LOAD addresses 2**24")
        for at in range(0, len(image), chunk):
            yield struct.pack(LOAD_HEADER_FORMAT, memory, at & 0xFFFF, at >> 16) + bytes(image[at:at + chunk])


def commit_payload(sha256, payloads):
    """COMMIT's payload after ``payloads`` were taken: the identity, the CRC-32 (zlib's) over them."""
    check = 0
    for payload in payloads:
        check = zlib.crc32(payload, check)
    return struct.pack(COMMIT_FORMAT, bytes.fromhex(sha256), check)


class FrameReader:
    """Reads reply frames from a byte source (``read(n)`` returning up to n bytes, b"" on timeout)."""

    def __init__(self, read):
        self.read = read

    def _exactly(self, count):
        data = b""
        while len(data) < count:
            chunk = self.read(count - len(data))
            if not chunk:
                raise TimeoutError(f"the device stopped answering mid-frame ({len(data)} of {count} bytes)")
            data += chunk
        return data

    def next(self):
        """The next well-formed reply: ``(type, tag, payload)``. Bytes before a sync are skipped."""
        while True:
            first = self.read(1)
            if not first:
                raise TimeoutError("no reply from the device")
            if first[0] != REPLY_SYNC:
                continue
            header = self._exactly(3)
            payload = self._exactly(header[2])
            check = self._exactly(1)[0]
            if crc8(header + payload) != check:
                raise IOError("a reply failed its CRC: the serial line corrupts data")
            return header[0], header[1], payload
