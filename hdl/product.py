"""Products, each made of pieces that fit a multiplier, with their operands in registers of their own.

An ECP5 multiplier takes 18-bit signed operands. A wider product is cut into the pieces the
plan counts (:func:`plan.arithmetic.product_terms`): each pair of pieces is a product of its
own, registered, and the pieces' products are added where the product is used. Yosys would
otherwise cut it itself and add the partial products in the same cycle, after the
multipliers' own delay: the slowest path of a design.
"""

from amaranth.hdl import ClockSignal, Const, Instance, Mux, Signal, signed

from plan.arithmetic import (MULTIPLIER_BITS, NARROWEST_MULTIPLIED, constant_product_terms, piece_value, pieces,
                             product_terms as planned_terms, signed_digits)

__all__ = ["product_terms", "operand_terms", "split_product", "nibble_products", "lut_product", "operand_product",
           "dsp_product", "tree_sum"]


def _register(m, value, enable, shape, name):
    """``value`` in a register of ``shape`` (moving on ``enable``)."""
    register = Signal(shape, name=name)
    with m.If(enable):
        m.d.sync += register.eq(value)
    return register


def _piece(value, piece):
    part = value[piece.low:piece.low + piece.bits]
    return part.as_signed() if piece.signed else part


def _shifts(narrow, narrow_signed, wide):
    """``narrow · wide`` as a sum of shifted copies of ``wide``, one per bit of ``narrow``."""
    terms = [Mux(narrow[i], wide << i, 0) for i in range(len(narrow))]
    if narrow_signed:
        terms[-1] = -terms[-1]  # the sign bit weighs −2^i
    return sum(terms[1:], terms[0])


def _terms(m, a, b, enable, width, name, *, multiply, hold):
    """The registered terms whose sum is ``a · b`` (``b`` a signal, or an int: a constant), with
    ``multiply(x, y, name)`` the product of two operands and ``hold(value, name)`` an operand as
    the multipliers see it. A term is as wide as its pieces' product, but the top one, which is
    ``width`` wide."""
    a_signed = a.shape().signed
    if isinstance(b, int):
        terms = constant_product_terms(len(a), a_signed, b)
    else:
        terms = planned_terms(len(a), a_signed, len(b), b.shape().signed)
    top_a, top_b = len(pieces(len(a), a_signed)) - 1, None
    out = []
    for index, term in enumerate(terms):
        if len(terms) == 1:
            term_name = name
        elif len(terms) == 2 and term.b.low == 0 and (isinstance(b, int) or len(pieces(len(b), b.shape().signed)) == 1):
            term_name = f"{name}_{'low' if term.a.low == 0 else 'high'}"
        else:
            term_name = f"{name}_{term.a.low}_{term.b.low}"
        a_piece = _piece(a, term.a)
        top = term.a.low == pieces(len(a), a_signed)[top_a].low and (
            isinstance(b, int) or term.b.low == pieces(len(b), b.shape().signed)[-1].low)
        term_width = width if top else min(width, term.a.bits + term.b.bits + 1)
        if isinstance(b, int):
            value = piece_value(b, term.b)
            if term.kind == "shifts":
                held = hold(a_piece, f"{term_name}_a")
                product = sum((held << shift) if sign > 0 else -(held << shift) for shift, sign in signed_digits(value))
            else:
                product = multiply(a_piece, Const(value, signed(term.b.bits + (not term.b.signed))),
                                   f"{term_name}_multiplier")
        else:
            b_piece = _piece(b, term.b)
            if term.kind == "shifts":
                # A narrow piece: a sum of shifted copies of the other costs less than a multiplier.
                (narrow, narrow_signed, narrow_name), (wide, wide_name) = (
                    ((a_piece, term.a.signed, "high_bits"), (b_piece, "b")) if term.a.bits <= term.b.bits
                    else ((b_piece, term.b.signed, "b_bits"), (a_piece, "a")))
                product = _shifts(hold(narrow, f"{term_name}_{narrow_name}"), narrow_signed,
                                  hold(wide, f"{term_name}_{wide_name}"))
            else:
                product = multiply(a_piece, b_piece, f"{term_name}_multiplier")
        register = _register(m, product, enable, signed(term_width), term_name)
        shift = term.a.low + term.b.low
        # (A shift by 0 is left out: Yosys would not merge an adder tree through it.)
        out.append(register << shift if shift else register)
    if not out:
        out.append(Const(0, signed(1)))
    return out


def product_terms(m, a, b, enable, width, name):
    """``a · b`` of two registered operands as the registers, one cycle later (moving on
    ``enable``), whose sum it is (to be added where the product is used)."""
    return _terms(m, a, b, enable, width, name, multiply=lambda x, y, _: x * y, hold=lambda value, _: value)


def operand_terms(m, platform, a, b, enable, width, name):
    """As :func:`product_terms`, but of operands not yet registered: the pieces go into operand
    registers (a multiplier's own, see :func:`operand_product`), the terms into registers a
    cycle later, all moving on ``enable``."""
    return _terms(m, a, b, enable, width, name,
                  hold=lambda value, register_name: _register(m, value, enable, value.shape(), register_name),
                  multiply=lambda x, y, multiplier_name: operand_product(m, platform, x, y, enable=enable,
                                                                         name=multiplier_name))


def split_product(m, a, b, enable, width, name):
    """The product ``a · b`` of registered operands in a register: a cycle later where it is
    one term, two where its terms are added in a stage of their own."""
    terms = product_terms(m, a, b, enable, width, name)
    if len(terms) == 1:
        return terms[0]
    return _register(m, sum(terms[1:], terms[0]), enable, signed(width), f"{name}_sum")


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


def lut_product(a, b, *, name):
    """``a · b`` for an 8-bit signed ``b``, made of LUT logic and registered, as the two partial
    products of :func:`nibble_products`. Returns the register assignments (for the caller's
    domain and enable) and the terms the product is the sum of, to be added where the product
    is used. (A product in DSP blocks: :func:`dsp_product`.)"""
    low = Signal(signed(len(a) + 5), name=f"{name}_low")
    high = Signal(signed(len(a) + 4), name=f"{name}_high")
    low_part, high_part = nibble_products(a, b)
    return [low.eq(low_part), high.eq(high_part)], [low, high << 4]


def operand_product(m, platform, a, b, *, enable=1, name):
    """``a · b`` as ``a`` and ``b`` were a cycle earlier: the product of two operand registers
    (moving on ``enable``), not itself registered.

    On an ECP5, where both fit one multiplier (and are wide enough for Yosys to take one), the
    operand registers are the multiplier's own (``MULT18X18D`` with its A and B input
    registers): the long route into a multiplier then ends in a register, and only the
    multiplier's delay and the route out lie between it and the next. Elsewhere
    (simulation), two registers do the same.
    """
    width = len(a) + len(b) + (0 if a.shape().signed or b.shape().signed else 1)
    fits = all(len(pieces(len(operand), operand.shape().signed)) == 1 and len(operand) >= NARROWEST_MULTIPLIED
               for operand in (a, b))
    if getattr(platform, "family", None) != "ecp5" or not fits:
        registered_a = _register(m, a, enable, a.shape(), f"{name}_a")
        registered_b = _register(m, b, enable, b.shape(), f"{name}_b")
        product = Signal(signed(width), name=name)
        m.d.comb += product.eq(registered_a * registered_b)
        return product
    # Both operands sign-extended (or zero-extended, if unsigned) to 18 bits, multiplied signed.
    wide_a = Signal(signed(MULTIPLIER_BITS), name=f"{name}_a")
    wide_b = Signal(signed(MULTIPLIER_BITS), name=f"{name}_b")
    wide_product = Signal(signed(2 * MULTIPLIER_BITS), name=f"{name}_p")
    m.d.comb += [wide_a.eq(a), wide_b.eq(b)]
    registers = {f"p_REG_INPUT{port}_{what}": value for port in "AB"
                 for what, value in (("CLK", "CLK0"), ("CE", "CE0"), ("RST", "RST0"))}
    m.submodules[name] = Instance(
        "MULT18X18D", **registers,
        i_CLK0=ClockSignal("sync"), i_CE0=enable, i_RST0=0,
        i_SIGNEDA=1, i_SIGNEDB=1, i_SOURCEA=0, i_SOURCEB=0,
        **{f"i_A{bit}": wide_a[bit] for bit in range(MULTIPLIER_BITS)},
        **{f"i_B{bit}": wide_b[bit] for bit in range(MULTIPLIER_BITS)},
        **{f"i_C{bit}": 0 for bit in range(MULTIPLIER_BITS)},
        **{f"o_P{bit}": wide_product[bit] for bit in range(2 * MULTIPLIER_BITS)})
    product = Signal(signed(width), name=name)
    m.d.comb += product.eq(wide_product[:width])
    return product


def dsp_product(m, platform, a, b, *, enable=1, name):
    """``a · b`` from operand registers of its own, registered: as :func:`lut_product` gives it,
    the register assignments (for the caller's domain and enable) and the terms the product is
    the sum of (one, where both operands fit a multiplier)."""
    width = len(a) + len(b)
    terms = operand_terms(m, platform, a, b, enable, width, name)
    return [], terms
