"""The generation command, on the golden backend."""

import subprocess
import sys

import pytest

from host.backends import GoldenBackend
from host.generate import main
from int8model import Golden, load
from int8model.train import Tokenizer

SHIPPED = "models/zen32.json"


def test_gen_lines_follow_the_golden_trace(capsys):
    assert main(["--backend", "golden", "--model", SHIPPED, "--prompt", "3,1,4", "--generate", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = [t.next for t in Golden(load(SHIPPED)).generate([3, 1, 4], 20)]
    assert lines == [f"GEN {i} {tok}" for i, tok in enumerate(expected)]


def test_text_is_encoded_and_continued(capsys):
    assert main(["--backend", "golden", "--model", SHIPPED, "--text", "Beautiful is", "--generate", "10"]) == 0
    out = capsys.readouterr().out.strip()
    model = load(SHIPPED)
    tokenizer = Tokenizer(model.tokenizer)
    expected = [t.next for t in Golden(model).generate(tokenizer.encode("beautiful is"), 10)]
    assert out == "beautiful is" + tokenizer.decode(expected)


def test_text_is_shown_as_each_token_arrives(capsys, monkeypatch):
    shown = []  # what the command had shown before each token came, and at the end
    generate = GoldenBackend.generate

    def watched(self, prompt, count):
        for token in generate(self, prompt, count):
            shown.append(capsys.readouterr().out)
            yield token
    monkeypatch.setattr(GoldenBackend, "generate", watched)
    assert main(["--backend", "golden", "--model", SHIPPED, "--text", "Beautiful is", "--generate", "5"]) == 0
    shown.append(capsys.readouterr().out)
    model = load(SHIPPED)
    tokenizer = Tokenizer(model.tokenizer)
    tokens = [t.next for t in Golden(model).generate(tokenizer.encode("beautiful is"), 5)]
    pieces = [tokenizer.decode([t]) for t in tokens]
    assert shown == ["beautiful is", *pieces[:-1], pieces[-1] + "\n"]


@pytest.mark.parametrize("args, message", [
    (["--prompt", "3,1,40"], "token 40 is outside the vocab 0..31"),
    (["--prompt", "1,2", "--generate", "32"], "need 33 positions, but the cache holds seq_len 32"),
    (["--text", "what #"], "characters outside the model's vocabulary: '#'"),
    (["--prompt", "1", "--generate", "0"], "cannot generate 0 tokens"),
    (["--prompt", ",".join(["1"] * 33)], "33 prompt tokens, but the cache holds seq_len 32"),
    (["--prompt", "1", "--model", "no/such/model.json"], "cannot read no/such/model.json"),
])
def test_bad_requests_are_clear_errors(capsys, args, message):
    assert main(["--backend", "golden"] + args) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "GEN" not in captured.out


def test_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "host.generate", "--backend", "golden",
                             "--prompt", "5", "--generate", "2"],
                            capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[0].startswith("GEN 0 ")
    assert result.stderr.startswith("model sha256 ")
