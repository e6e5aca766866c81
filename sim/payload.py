"""Packing Python values into the flat bit vectors that generated Verilog ports carry, and back.

A ``data.StructLayout`` becomes a dict, a ``data.ArrayLayout`` a list, a signed shape a
negative-capable int: the same structure the Amaranth component declares.
"""

from amaranth.hdl import Shape
from amaranth.lib import data

__all__ = ["pack", "unpack", "width"]


def width(shape):
    if isinstance(shape, data.Layout):
        return shape.size
    return Shape.cast(shape).width


def pack(shape, value):
    if isinstance(shape, data.Layout):
        word = 0
        for key, field in shape:
            part = pack(field.shape, value[key])
            word |= part << field.offset
        return word
    shape = Shape.cast(shape)
    if not shape.signed and value < 0:
        raise ValueError(f"{value} does not fit unsigned({shape.width})")
    return value & ((1 << shape.width) - 1)


def unpack(shape, word):
    if isinstance(shape, data.Layout):
        items = {key: unpack(field.shape, (word >> field.offset) & ((1 << width(field.shape)) - 1))
                 for key, field in shape}
        if isinstance(shape, data.ArrayLayout):
            return [items[i] for i in range(shape.length)]
        return items
    shape = Shape.cast(shape)
    word &= (1 << shape.width) - 1
    if shape.signed and shape.width and word >> (shape.width - 1):
        word -= 1 << shape.width
    return word
