"""How long the serial line takes to carry a generation: what a host receives, not what the
engine computes.

The device queues each token as its step ends and starts a ``TOKEN`` reply, carrying every
token queued (up to 255), whenever the line is free (``hdl.protocol``); a reply costs five bytes
of framing, a byte ten bits (8N1). So once the engine outpaces the line, the line carries a
little over a byte a token.
"""

import struct

from . import COUNT_FORMAT, MAX_PAYLOAD, POSITION_FORMAT

__all__ = ["BITS_PER_BYTE", "FRAMING", "generation_on_the_line"]

BITS_PER_BYTE = 10  # start, eight data bits, stop
FRAMING = 5         # sync, type or command, tag, length, CRC


def generation_on_the_line(step_cycles, divisor):
    """A ``GENERATE`` of ``len(step_cycles) + 1`` tokens, the first made by the prompt's last
    step and each next one by a step of ``step_cycles[i]`` clock cycles, on a line of
    ``divisor`` clock cycles a bit: ``(cycles, line_bytes)`` from the request's first bit to the
    closing ``OK`` reply's last, and the bytes both ways."""
    byte = BITS_PER_BYTE * divisor
    request = FRAMING + struct.calcsize(COUNT_FORMAT)
    now = request * byte
    ready = [now]
    for cycles in step_cycles:
        ready.append(ready[-1] + cycles)
    sent, line_bytes = 0, request
    while sent < len(ready):
        start = max(now, ready[sent])
        queued = sum(1 for t in ready[sent:] if t <= start)
        n = min(queued, MAX_PAYLOAD)
        now = start + (FRAMING + n) * byte
        sent += n
        line_bytes += FRAMING + n
    done = FRAMING + struct.calcsize(POSITION_FORMAT)
    return now + done * byte, line_bytes + done
