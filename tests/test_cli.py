"""The commands: one set of shape options, and a --help that gives every default, without markup."""

import importlib
import re

import pytest

COMMANDS = ["flows.build", "flows.cost", "sim.cycles", "sim.board", "bench.speed", "host.generate",
            "host.selftest", "sim.formal", "int8model.train", "int8model.train_deep"]
SHAPE_OPTIONS = ["--device", "--ways", "--lanes", "--lut-ways", "--qkv-table", "--hidden-in-lanes",
                 "--attention-rows"]


def help_of(command, capsys):
    with pytest.raises(SystemExit) as done:
        importlib.import_module(command).main(["--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_gives_every_default_without_markup(command, capsys):
    text = help_of(command, capsys)
    assert "``" not in text and "`" not in text
    options = re.split(r"\n  (?=-)", text.split("\noptions:", 1)[1])[1:]
    for option in options:
        flat = " ".join(option.split())
        if not flat.startswith("-h"):
            assert re.search(r"default|required", flat), f"{command}: {flat}"


@pytest.mark.parametrize("command", ["flows.build", "flows.cost", "sim.cycles", "sim.board", "bench.speed",
                                     "host.generate", "host.selftest"])
def test_every_command_that_makes_a_plan_takes_the_same_shape_options(command, capsys):
    text = help_of(command, capsys)
    group = text.split("shape of the engine (default: what the part's build chooses):", 1)[1]
    assert [option for option in SHAPE_OPTIONS if re.search(rf"\n  {option}\b", group)] == SHAPE_OPTIONS


def test_console_scripts_name_the_commands():
    import tomllib
    from pathlib import Path
    scripts = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name
    assert set(scripts.values()) >= {f"{command}:main" for command in COMMANDS}
