"""The text the demo models learn from, and the text they are judged on.

``zen()``: the Zen of Python, from the standard library. ``kjv()``: the King James Bible, from
Debian's ``bible-kjv-text`` (read through its ``bible`` program), installed with apt where it is
missing; its verses, lowercased, one a line, split into the verses trained on and the ones held
out (every chapter whose number is a multiple of ``HELD_OUT_EVERY``), which no model sees
before it is judged.
"""

import codecs
import contextlib
import io
import os
import re
import shutil
import subprocess

__all__ = ["zen", "kjv", "Corpus", "HELD_OUT_EVERY"]

HELD_OUT_EVERY = 20
KJV_PACKAGES = ("bible-kjv-text", "bible-kjv")
KJV_RANGE = "Ge1:1-Re22:21"


def zen():
    """The Zen of Python (the standard library's ``this``), lowercased."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the poem
        import this
    return codecs.decode(this.s, "rot13").lower()


class Corpus:
    """A corpus split for training: ``train`` and ``held_out`` texts."""

    def __init__(self, train, held_out):
        self.train, self.held_out = train, held_out

    @property
    def chars(self):
        return "".join(sorted(set(self.train) | set(self.held_out)))


def _bible_text():
    """The whole of the King James Bible as the ``bible`` program prints it, installing it
    through apt where it is missing."""
    if shutil.which("bible") is None:
        command = ["apt-get", "install", "-y", "-qq", *KJV_PACKAGES]
        if os.geteuid() != 0:
            command = ["sudo"] + command
        print(f"corpus: installing {' '.join(KJV_PACKAGES)} (apt)", flush=True)
        subprocess.run(command, check=True)
    result = subprocess.run(["bible", KJV_RANGE], capture_output=True, text=True, check=True)
    return result.stdout


def kjv(text=None):
    """The King James Bible's verses, lowercased, one a line, as a :class:`Corpus` (``text``:
    the ``bible`` program's output, where already at hand)."""
    text = _bible_text() if text is None else text
    train, held_out = [], []
    chapter, verse = 0, None
    for line in text.splitlines():
        if re.fullmatch(r"\S.* \d+", line):  # a chapter's heading: "Genesis 1"
            chapter = int(line.rsplit(" ", 1)[1])
            continue
        start = re.fullmatch(r"\s+\d+ (.*)", line)
        if start:
            verse = [start.group(1).strip()]
            (held_out if chapter % HELD_OUT_EVERY == 0 else train).append(verse)
        elif line.strip() and verse is not None:
            verse.append(line.strip())  # a verse's wrapped line
    join = lambda verses: "\n".join(" ".join(parts).lower() for parts in verses) + "\n"
    return Corpus(join(train), join(held_out))
