"""The engine's command interface: what a controller (the command protocol, a bench) sees of it."""

import enum

from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Op", "Error", "command_layout", "status_layout", "EngineControl"]


class Op(enum.IntEnum):
    NEW = 0       # start a new sequence: position 0
    FEED = 1      # run a step for `arg` (a prompt token) at the current position
    GENERATE = 2  # emit the last step's next token, then run `arg − 1` steps feeding each back
    PREFILL = 3   # as FEED, for a prompt token whose next token is not asked for: only K and V


class Error(enum.IntEnum):
    NONE = 0
    TOKEN = 1      # a token outside the vocab
    POSITION = 2   # a step at or past seq_len
    NO_PROMPT = 3  # GENERATE with no step run since NEW
    COUNT = 4      # GENERATE 0


def command_layout(seq_len):
    return data.StructLayout({"op": 2, "arg": unsigned(max(8, seq_len.bit_length()))})


def status_layout(seq_len):
    return data.StructLayout({
        "pos": range(seq_len + 1), "error": 3, "busy": 1, "cycles": 32, "steps": 32})


class EngineControl(wiring.Signature):
    """An engine's control, seen from its controller, for a context of ``seq_len`` positions.

    Members
    -------
    cmd : ``Out(stream.Signature(command_layout))``
        An :class:`Op` and its argument: a token for ``FEED`` and ``PREFILL``, a count for
        ``GENERATE``. A ``PREFILL`` step makes only what later steps read of it, the cache row
        ``K[pos]``, ``V[pos]``, and leaves no next token for ``GENERATE``. Taken when the engine
        is idle.
    tokens : ``In(stream.Signature(8))``
        Each generated token, as it is made, from a register: the next step starts at once,
        and waits only if the previous token has still not been taken when it ends.
    status : ``In(status_layout)``
        The position of the next step, the last command's :class:`Error`, whether a command is
        running (from the command's acceptance until its last step ends), the cycles of the
        last step and the steps since ``NEW``.

    A refused command changes nothing but the error code: the cache and the position stay.
    """

    def __init__(self, seq_len):
        super().__init__({
            "cmd": Out(stream.Signature(command_layout(seq_len))),
            "tokens": In(stream.Signature(8)),
            "status": In(status_layout(seq_len)),
        })
