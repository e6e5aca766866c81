"""The flows that turn a plan into something: a bitstream and its report (``build``), each
unit's cost (``cost``)."""
