"""The command-line options every command that makes a plan shares, declared once."""

import argparse
from pathlib import Path

from .parts import PARTS
from .limits import limits_for
from .plan import choose_plan, make_loadable_plan, make_plan
from .shape import ATTENTION_ROWS, DEFAULT_ATTENTION_ROWS, MAX_WAYS, Shape

__all__ = ["SHIPPED_MODEL", "add_model_argument", "add_shape_arguments", "asked_shape", "plan_from_arguments",
           "model_and_plan", "shape_arguments"]

SHIPPED_MODEL = Path(__file__).resolve().parent.parent / "models" / "zen32.json"


def add_model_argument(parser):
    parser.add_argument("--model", type=Path, default=SHIPPED_MODEL,
                        help="the int8 model file (default: the shipped demo model, models/zen32.json)")


def add_shape_arguments(parser, *, device_help="the ULX3S's ECP5 part, whose build's shape to take"):
    """The part, and the shape of the engine: what changes its cycles and resources, never its results."""
    group = parser.add_argument_group("shape of the engine (default: what the part's build chooses)")
    group.add_argument("--device", choices=sorted(PARTS), default="85F", help=f"{device_help} (default: %(default)s)")
    group.add_argument("--ways", type=int, choices=range(1, MAX_WAYS + 1),
                       help="elements a cycle between the units (default: the most multipliers the part fits, "
                            "then the most ways)")
    group.add_argument("--lanes", type=int,
                       help="MAC lanes (default: d_model, or a half or a quarter of it, rounded up to a multiple "
                            "of the ways, as the chosen shape has)")
    group.add_argument("--lut-ways", type=int,
                       help="of each MAC lane's multipliers, how many are built from LUTs (default: none, or one "
                            "where the DSP blocks run out)")
    group.add_argument("--qkv-table", action=argparse.BooleanOptionalAction, default=None,
                       help="read q, k and v from a table of every token and position (default: where it takes "
                            "at most 128 KB and the part has the block RAM)")
    group.add_argument("--hidden-in-lanes", action="store_true",
                       help="keep the FFN's hidden vector in the MAC lanes: fewer cycles per token, many LUT4s "
                            "more, a slower place and route (default: off)")
    group.add_argument("--loadable", action="store_true",
                       help="build for the model's shape, with no model baked in: any model of that shape within "
                            "the build's limits is loaded at run time over the serial line, docs/loading.md (default: off)")
    group.add_argument("--attention-rows", type=int, choices=ATTENTION_ROWS, default=DEFAULT_ATTENTION_ROWS,
                       help="cache rows attention reads a cycle, each a bank of block RAM and d_model "
                            "multipliers, the first's in DSP blocks, the others' in LUTs (default: %(default)s)")


def asked_shape(args):
    """The :class:`~.shape.Shape` the options ask for, ``None`` where the part's choice decides."""
    return Shape(lanes=args.lanes, ways=args.ways, lut_ways=args.lut_ways, qkv_table=args.qkv_table,
                 hidden_in_lanes=args.hidden_in_lanes, attention_rows=args.attention_rows)


def plan_from_arguments(model, args, *, any_shape=False):
    """The plan the options ask for: on the part, its choice of what they leave open
    (:func:`~.plan.choose_plan`); with ``any_shape``, a shape given in full (ways and lanes)
    is taken whether or not a part has room for it. Raises :class:`~.plan.FitError`."""
    asked = asked_shape(args)
    limits = limits_for(model) if getattr(args, "loadable", False) else None
    if any_shape and asked.ways and asked.lanes:
        shape = Shape(asked.lanes, asked.ways, asked.lut_ways or 0, asked.qkv_table, asked.hidden_in_lanes,
                      asked.attention_rows)
        return make_plan(model, shape) if limits is None else make_loadable_plan(limits, shape)
    return choose_plan(model, args.device, asked, limits=limits)


def model_and_plan(parser, args, *, any_shape=True):
    """The model the options name and the plan they ask for; a model file that cannot be used
    or a shape that does not fit ends the command (exit status 2) with the reason."""
    from int8model.bounds import BoundsError
    from int8model.format import ModelError, load
    from .plan import FitError
    try:
        model = load(args.model)
        return model, plan_from_arguments(model, args, any_shape=any_shape)
    except (ModelError, BoundsError) as error:
        parser.exit(2, f"error: {error}\n")
    except FitError as error:
        parser.exit(2, f"error: {error}\nGive --ways and --lanes for a shape that no part takes.\n")


def shape_arguments(shape, device=None, *, loadable=False):
    """The options that ask for ``shape`` (its fields that are not ``None``), and a loadable
    build, for another command."""
    out = [] if device is None else ["--device", device]
    for option, value in (("--lanes", shape.lanes), ("--ways", shape.ways), ("--lut-ways", shape.lut_ways),
                          ("--attention-rows", shape.attention_rows)):
        if value is not None:
            out += [option, str(value)]
    if shape.qkv_table is not None:
        out.append("--qkv-table" if shape.qkv_table else "--no-qkv-table")
    if shape.hidden_in_lanes:
        out.append("--hidden-in-lanes")
    return out + (["--loadable"] if loadable else [])
