"""Products wider than a multiplier, cut in two so that each half is one multiplier.

An ECP5 multiplier takes 18-bit signed operands. Yosys maps a wider product onto several
and adds their outputs in the same cycle, after the multipliers' own delay: the slowest
path of a design. ``split_product`` instead registers each half's product and adds them
in the next cycle.
"""

from amaranth.hdl import Mux, Signal, signed

__all__ = ["MULTIPLIER_BITS", "product_stages", "product_terms", "split_product", "nibble_products",
           "registered_product", "tree_sum"]

MULTIPLIER_BITS = 18
LOW_BITS = MULTIPLIER_BITS - 1  # the low half goes in unsigned, so one bit less
SHIFT_ADD_BITS = 3  # a high half this narrow is added up in logic instead


def product_stages(a_bits, signed=True):
    """Cycles from registered operands to the registered product: 1, or 2 when cut."""
    return 1 if a_bits + (0 if signed else 1) <= MULTIPLIER_BITS else 2


def product_terms(m, a, b, enable, width, name):
    """``a · b`` as the registers, one cycle later (moving on ``enable``), whose sum it is: the
    product, or its two halves where ``a`` is wider than a multiplier (to be added where the
    product is used). ``b`` must fit a multiplier."""
    if product_stages(len(a), a.shape().signed) == 1:
        product = Signal(signed(width), name=name)
        with m.If(enable):
            m.d.sync += product.eq(a * b)
        return [product]
    high_part = a[LOW_BITS:].as_signed() if a.shape().signed else a[LOW_BITS:]
    if len(high_part) <= SHIFT_ADD_BITS:
        # A few high bits: a sum of shifted copies of `b` costs less than a multiplier.
        terms = [Mux(high_part[i], b << i, 0) for i in range(len(high_part))]
        if a.shape().signed:
            terms[-1] = -terms[-1]  # the sign bit weighs −2^i
        high_product = sum(terms)
    else:
        high_product = high_part * b
    low = Signal(signed(LOW_BITS + len(b) + 1), name=f"{name}_low")
    high = Signal(signed(width), name=f"{name}_high")
    with m.If(enable):
        m.d.sync += [low.eq(a[:LOW_BITS] * b), high.eq(high_product)]
    return [low, high << LOW_BITS]


def split_product(m, a, b, enable, width, name):
    """The product ``a · b`` in a register ``product_stages`` cycles later (moving on
    ``enable``); ``b`` must fit a multiplier."""
    terms = product_terms(m, a, b, enable, width, name)
    if len(terms) == 1:
        return terms[0]
    product = Signal(signed(width), name=f"{name}_sum")
    with m.If(enable):
        m.d.sync += product.eq(terms[0] + terms[1])
    return product


def nibble_products(a, b):
    """``a · b`` for an 8-bit signed ``b``, made of logic rather than a multiplier: the two
    partial products ``(low, high)`` with ``a · b == low + (high << 4)``, ``low`` by ``b``'s
    low nibble (unsigned), ``high`` by its high nibble (signed).

    Each is a sum of four shifted copies of ``a``, and no ``*``: Yosys infers no DSP block
    for it, so a design can have more products than its part has multipliers.
    """
    def by_nibble(nibble, signed_nibble):
        terms = [Mux(nibble[i], a << i, 0) for i in range(4)]
        if signed_nibble:
            terms[3] = -terms[3]  # the sign bit weighs −2^3
        return (terms[0] + terms[1]) + (terms[2] + terms[3])
    return by_nibble(b[0:4], False), by_nibble(b[4:8], True)


def tree_sum(terms):
    """The sum of ``terms`` as a balanced tree of adds: few carry chains in series."""
    terms = list(terms)
    while len(terms) > 1:
        terms = [a + b for a, b in zip(terms[0::2], terms[1::2])] + terms[len(terms) & ~1:]
    return terms[0]


def registered_product(a, b, *, in_luts, name):
    """``a · b`` for an 8-bit signed ``b``, registered: in a multiplier, or in LUT logic as the
    two partial products of :func:`nibble_products`. Returns the register assignments (for the
    caller's domain and enable) and the terms the product is the sum of, to be added where the
    product is used."""
    if not in_luts:
        product = Signal(signed(len(a) + len(b)), name=name)
        return [product.eq(a * b)], [product]
    low = Signal(signed(len(a) + 5), name=f"{name}_low")
    high = Signal(signed(len(a) + 4), name=f"{name}_high")
    low_part, high_part = nibble_products(a, b)
    return [low.eq(low_part), high.eq(high_part)], [low, high << 4]
