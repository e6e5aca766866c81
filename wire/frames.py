"""Request frames as a host sends them (``docs/protocol.md``): one frame, and the frames that
load a model into a loadable build and commit it."""

import struct
import zlib

from . import COMMIT_FORMAT, LOAD_HEADER_FORMAT, MAX_LOAD_DATA, MAX_PAYLOAD, REQUEST_SYNC, Command, crc8

__all__ = ["encode_request", "load_payloads", "commit_payload", "load_frames"]


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


def load_frames(images, sha256):
    """The request frames of a whole load of ``images``, then its commit as ``sha256``: what
    :meth:`host.device.Device.load` sends on a clean line, tagged from 0."""
    payloads = list(load_payloads(images))
    frames = [encode_request(Command.LOAD, tag & 0xFF, payload) for tag, payload in enumerate(payloads)]
    frames.append(encode_request(Command.COMMIT, len(payloads) & 0xFF, commit_payload(sha256, payloads)))
    return b"".join(frames)
