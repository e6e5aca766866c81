"""The README says what is true: its paths exist, its commands take the options it shows, and
it stays short enough to read."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# ``.venv/bin/python -m module args…`` in a shell block, as a user would type it.
COMMAND = re.compile(r"^\.venv/bin/python -m ([\w.]+)(.*)$", re.MULTILINE)


def commands():
    found = {}
    for path in DOCS:
        for module, args in COMMAND.findall(path.read_text()):
            if module != "pytest":
                found.setdefault(module, set()).update(re.findall(r"(--[a-z][a-z0-9-]*)", args.split("#")[0]))
    return found


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 160


def test_what_is_here_is_here():
    table = README.split("## What is here", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) >= 10
    for row in rows:
        for path in re.findall(r"`([\w./-]+)`", row):
            if "/" in path:
                assert (ROOT / path).exists(), f"README's 'What is here' names {path}, which is not here"


@pytest.mark.parametrize("module, options", sorted(commands().items()), ids=sorted(commands()))
def test_documented_commands_take_their_options(module, options):
    shown = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr
    missing = sorted(option for option in options if option not in shown.stdout)
    assert not missing, f"python -m {module} does not take {missing}"
