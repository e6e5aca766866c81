"""The plan: where a model and a part become the decisions the hardware is built from.

Nothing here imports Amaranth. ``make_plan(model, shape, part)`` gives a frozen :class:`Plan`
(or raises :class:`FitError`), ``choose_plan(model, part)`` the shape a part fits best, and
``make_contents(plan, model)`` the values its memories start with; ``Limits`` what a loadable
build of a shape takes (docs/loading.md).
"""

from .contents import Contents, make_contents
from .limits import LimitError, Limits, check_limits, envelope, limits_for
from .parts import PARTS, Part
from .plan import FitError, MemoryPlan, Plan, check_fit, choose_plan, make_loadable_plan, make_plan
from .schedule import Matrix, Stage
from .shape import Shape

__all__ = ["Plan", "make_plan", "make_loadable_plan", "choose_plan", "check_fit", "FitError", "MemoryPlan", "Contents", "make_contents",
           "Shape", "Part", "PARTS", "Stage", "Matrix",
           "Limits", "LimitError", "limits_for", "check_limits", "envelope"]
