"""The one-layer int8 model: its file format, its bounds and its golden decode step."""

from .format import Model, ModelError, load, loads
from .bounds import Bound, BoundsError, analyse
from .golden import DecodeError, Golden, Trace

__all__ = ["Model", "ModelError", "load", "loads", "Bound", "BoundsError", "analyse",
           "DecodeError", "Golden", "Trace"]
