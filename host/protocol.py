"""The host's side of the command protocol: framing and CRC, written independently of the HDL.

Request ``A5 cmd tag len payload crc``, reply ``5A type tag len payload crc``; the CRC is
CRC-8/AUTOSAR (polynomial 0x2F, initial 0xFF, final XOR 0xFF) over the bytes after the sync,
computed by :func:`wire.crc8`. The numbers of commands, replies and faults are the ones the
device is built with (:mod:`wire`).
"""

from wire import REPLY_SYNC, Command, Fault, Reply, crc8
from wire.frames import commit_payload, encode_request, load_frames, load_payloads

__all__ = ["crc8", "encode_request", "load_payloads", "commit_payload", "load_frames", "FrameReader",
           "Command", "Reply", "Fault"]


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
