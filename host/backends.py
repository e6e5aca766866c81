"""Backends a generation runs on, behind one interface.

A backend is opened for a model and yields the generated tokens of a prompt: ``golden`` is the
NumPy reference; ``sim`` and ``serial`` reach the hardware through the same command protocol.
"""

import time

from int8model.golden import Golden

__all__ = ["BACKENDS", "open_backend", "default_backend", "find_board"]


class GoldenBackend:
    def __init__(self, model):
        self.golden = Golden(model)

    def generate(self, prompt, count):
        for trace in self.golden.generate(prompt, count):
            yield trace.next

    def close(self):
        pass


class DeviceBackend:
    """A device over its serial protocol: the board, or the simulated board."""

    def __init__(self, model, transport, *, on_close=None, check=True, load=False, progress=None):
        from .device import Device
        self.device = Device(transport)
        self.on_close = on_close
        self.upload = None  # (bytes of the images, seconds) where the model was loaded
        try:
            if load and self.device.ident().sha256 != model.sha256:
                start = time.monotonic()
                sent = self.device.load_model(model, progress=progress)
                self.upload = sent, time.monotonic() - start
            self.ident = self.device.check_model(model) if check else None
        except BaseException:
            self.close()
            raise

    def generate(self, prompt, count):
        self.device.reset()
        self.device.feed(prompt)
        yield from self.device.generate(count)

    def close(self):
        self.device.close()
        if self.on_close:
            self.on_close()


def _golden(model, **_options):
    return GoldenBackend(model)


def _serial(model, *, port=None, baud=None, model_path=None, check=True, load=False, progress=None, **_options):
    import serial
    from wire import DEFAULT_BAUD
    port = port or find_board()
    if port is None:
        raise OSError("no ULX3S found on a serial port; give --port, or use --backend sim")
    return DeviceBackend(model, serial.Serial(port, baud or DEFAULT_BAUD, timeout=5), check=check, load=load,
                         progress=progress)


# A simulated board replies thousands of times more slowly than the board: the deep demo's
# prefill of a long prompt takes minutes of simulation before its reply.
SIM_REPLY_SECONDS = 1800


def _sim(model, *, model_path=None, shape=None, device="85F", check=True, load=False, loadable=False, progress=None,
         **_options):
    """``load``: the board is built for the model's shape with no model in it, and the model
    travels over its serial line."""
    import serial
    from sim.board import SimulatedBoard
    if model_path is None:
        raise ValueError("the simulated board is built from a model file: give its path")
    board = SimulatedBoard(model_path, shape, device, loadable=load or loadable)
    try:
        transport = serial.Serial(board.port, timeout=SIM_REPLY_SECONDS)
    except BaseException:
        board.close()
        raise
    return DeviceBackend(model, transport, on_close=board.close, check=check, load=load, progress=progress)


# The ULX3S's FT231X: FTDI's vendor id and that chip's product id.
FTDI_VENDOR, FT231X_PRODUCT = 0x0403, 0x6015


def find_board():
    """The serial port of an attached ULX3S, or ``None``."""
    from serial.tools import list_ports
    for port in list_ports.comports():
        if (port.vid, port.pid) == (FTDI_VENDOR, FT231X_PRODUCT):
            return port.device
    return None


def default_backend():
    """The board when one is attached, else the simulated board."""
    return "serial" if find_board() else "sim"


BACKENDS = {"golden": _golden, "sim": _sim, "serial": _serial}


def open_backend(name, model, **options):
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}") from None
    return factory(model, **options)
