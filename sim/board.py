"""Run the simulated board and hand out its serial port.

``python -m sim.board --model models/zen32.json`` prints the pseudo-terminal's path and serves
until interrupted; :class:`SimulatedBoard` does the same in the background for the host driver.
The board is the device top as the part's build would shape it (the shape options as
``hdl.build`` takes them), simulated under Icarus Verilog.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hdl.top import DeviceTop
from plan.loading import boot_image
from int8model.format import load
from plan import make_contents
from plan.options import add_model_argument, add_shape_arguments, asked_shape, plan_from_arguments, shape_arguments

from .runner import run_bench

__all__ = ["SIM_CLOCK_HZ", "SIM_BAUD", "SimulatedBoard"]

# The simulated UART runs at 4 clocks a bit: the same logic as on the board, far fewer cycles.
SIM_CLOCK_HZ = 12_000_000
SIM_BAUD = 3_000_000


def serve(args, ready, parent):
    model = load(args.model)
    plan = plan_from_arguments(model, args, any_shape=True)
    # No USB packets here: a frame's bytes come back to back, and 64 byte times of silence
    # (not the board's 10 ms) keep the truncation tests short.
    boot = boot_image(plan, load(args.boot)) if args.boot else None
    top = DeviceTop(plan, None if plan.loadable else make_contents(plan, model), boot=boot, clock_hz=SIM_CLOCK_HZ,
                    baud=SIM_BAUD, frame_timeout=64 * 10 / SIM_BAUD)
    run_bench(top, name="board", test_module="sim.bench_board", build_dir=ready.parent / "build",
              params={"divisor": top.divisor, "ready": str(ready), "parent": parent, "boots": plan.boot})


class SimulatedBoard:
    """A simulated board running in a child process; ``port`` is its serial port's path.
    ``shape``: a :class:`plan.Shape` (its ``None`` fields the ``device`` build's choice), or
    ``None`` (the build's choice). ``loadable``: built for the model's shape with no model in
    it (the model travels over the serial line: :meth:`host.device.Device.load_model`);
    ``boot``: a model file its boot image holds, as ``hdl.build --from`` writes it."""

    def __init__(self, model_path, shape=None, device="85F", timeout=300, *, loadable=False, boot=None):
        self.workdir = Path(tempfile.mkdtemp(prefix="simboard_"))
        self.ready = self.workdir / "port"
        command = [sys.executable, "-m", "sim.board", "--model", str(model_path),
                   "--ready", str(self.ready), "--parent", str(os.getpid())]
        command += shape_arguments(shape, device) if shape is not None else ["--device", device]
        command += ["--loadable"] if loadable else []
        command += ["--boot", str(boot)] if boot else []
        self.log = open(self.workdir / "log.txt", "w")
        # A session of its own, so that closing ends the simulator it runs as well.
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        cwd=Path(__file__).resolve().parent.parent,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout
        while not (self.ready.exists() and self.ready.read_text()):
            if self.process.poll() is not None:
                self.log.close()
                log = (self.workdir / "log.txt").read_text()[-2000:]
                shutil.rmtree(self.workdir, ignore_errors=True)
                raise RuntimeError(f"the simulated board failed to start:\n{log}")
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError("the simulated board did not start in time")
            time.sleep(0.2)
        self.port = self.ready.read_text()

    def close(self):
        self.ready.unlink(missing_ok=True)
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sim.board", description=__doc__.splitlines()[0])
    add_model_argument(parser)
    add_shape_arguments(parser)
    parser.add_argument("--ready", type=Path, help="write the port's path here when serving (default: print it)")
    parser.add_argument("--parent", type=int, help="stop when this process is gone (default: serve until interrupted)")
    parser.add_argument("--boot", type=Path, metavar="MODEL",
                        help="with --loadable: the boot image holds this model, as hdl.build --from writes it "
                             "(default: none, the board powers up with no model)")
    args = parser.parse_args(argv)
    if args.boot and not args.loadable:
        parser.error("--boot needs --loadable: a baked build's model is in its bitstream")
    if args.ready:
        serve(args, args.ready, args.parent)
        return 0
    board = SimulatedBoard(args.model, asked_shape(args), args.device, loadable=args.loadable, boot=args.boot)
    print(board.port, flush=True)
    try:
        board.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        board.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
