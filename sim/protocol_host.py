"""A host's side of the command protocol component in Amaranth's simulator: request bytes in
at a UART's pace, reply frames out (for tests that drive ``hdl.protocol`` without a UART)."""

from host.protocol import crc8
from wire import REPLY_SYNC

__all__ = ["send_bytes", "parse_replies"]


async def send_bytes(ctx, rx, data, byte_cycles):
    """Put ``data`` on the stream ``rx``, a byte every ``byte_cycles`` cycles."""
    for byte in data:
        ctx.set(rx.valid, 1)
        ctx.set(rx.payload, byte)
        await ctx.tick()
        ctx.set(rx.valid, 0)
        await ctx.tick().repeat(byte_cycles - 1)


def parse_replies(data, *, partial=False):
    """The reply frames in ``data`` as ``(type, tag, payload)``; a byte outside a frame or a
    frame failing its CRC fails an assertion, and so does a frame cut short unless ``partial``
    (more may still come), when the frames before it are returned."""
    frames, at = [], 0
    while at < len(data):
        assert data[at] == REPLY_SYNC, f"a byte outside a reply frame: {bytes(data[at:]).hex()}"
        whole = at + 4 < len(data) and at + 4 + data[at + 3] < len(data)
        if not whole and partial:
            break
        assert whole, "a reply cut short"
        kind, tag, length = data[at + 1:at + 4]
        assert crc8(bytes(data[at + 1:at + 4 + length])) == data[at + 4 + length], "a reply failed its CRC"
        frames.append((kind, tag, bytes(data[at + 4:at + 4 + length])))
        at += 5 + length
    return frames
