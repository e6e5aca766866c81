"""A host's side of the command protocol component in Amaranth's simulator: request bytes in
at a UART's pace, reply frames out (for tests that drive ``hdl.protocol`` without a UART), and
:class:`SimulatedLine`, the component behind a serial port's ``read``/``write`` for the host's
own driver."""

import queue
import threading
import time

from amaranth.sim import Simulator

from wire import REPLY_SYNC, crc8

__all__ = ["send_bytes", "parse_replies", "SimulatedLine"]


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


class SimulatedLine:
    """``dut``'s protocol (its ``rx`` and ``tx`` streams) in Amaranth's simulator, running in a
    thread of its own, behind pyserial's ``read(n)``, ``write(data)`` and ``timeout``: what is
    written goes in a byte every ``byte_cycles`` cycles. ``testbenches`` run beside it (what
    sits behind the component's other ports)."""

    def __init__(self, dut, *, byte_cycles, testbenches=(), timeout=5.0):
        self.dut, self.byte_cycles, self.timeout = dut, byte_cycles, timeout
        self._to_device = queue.Queue()
        self._received = bytearray()
        self._arrived = threading.Condition()
        self._closed = False
        sim = Simulator(dut)
        sim.add_clock(1e-8)
        for testbench in (*testbenches, self._collect):
            sim.add_testbench(testbench, background=True)
        sim.add_testbench(self._drive)
        self._thread = threading.Thread(target=sim.run, daemon=True)
        self._thread.start()

    async def _drive(self, ctx):
        while not self._closed:
            try:
                data = self._to_device.get_nowait()
            except queue.Empty:
                await ctx.tick().repeat(16)
                continue
            await send_bytes(ctx, self.dut.rx, data, self.byte_cycles)

    async def _collect(self, ctx):
        ctx.set(self.dut.tx.ready, 1)
        async for _, _, valid, byte in ctx.tick().sample(self.dut.tx.valid, self.dut.tx.payload):
            if valid:
                with self._arrived:
                    self._received.append(byte)
                    self._arrived.notify()

    def write(self, data):
        self._to_device.put(bytes(data))

    def read(self, count):
        deadline = time.monotonic() + self.timeout
        with self._arrived:
            while not self._received and time.monotonic() < deadline:
                self._arrived.wait(deadline - time.monotonic())
            data = bytes(self._received[:count])
            del self._received[:count]
        return data

    def close(self):
        self._closed = True
        self._thread.join()
