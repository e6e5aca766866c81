"""Backends a generation runs on, behind one interface.

A backend is opened for a model and yields the generated tokens of a prompt: ``golden`` is the
NumPy reference; ``sim`` and ``serial`` reach the hardware through the same command protocol.
"""

from int8model.golden import DecodeError, Golden

__all__ = ["BACKENDS", "open_backend", "check_request"]


def check_request(model, prompt, count):
    """Refuse, before anything runs, a request that no backend could serve."""
    if not prompt:
        raise DecodeError("the prompt is empty: a generation needs at least one token")
    if count < 1:
        raise DecodeError(f"cannot generate {count} tokens")
    for tok in prompt:
        if not 0 <= tok < model.vocab:
            raise DecodeError(f"token {tok} is outside the vocab 0..{model.vocab - 1}")
    steps = len(prompt) + count - 1
    if steps > model.seq_len:
        raise DecodeError(
            f"{len(prompt)} prompt tokens and {count} generated need {steps} positions, "
            f"but the cache holds seq_len {model.seq_len}")


class GoldenBackend:
    def __init__(self, model):
        self.golden = Golden(model)

    def generate(self, prompt, count):
        for trace in self.golden.generate(prompt, count):
            yield trace.next

    def close(self):
        pass


def _golden(model, **_options):
    return GoldenBackend(model)


BACKENDS = {"golden": _golden}


def open_backend(name, model, **options):
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}") from None
    return factory(model, **options)
