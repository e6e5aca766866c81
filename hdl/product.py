"""Products wider than a multiplier, cut in two so that each half is one multiplier.

An ECP5 multiplier takes 18-bit signed operands. Yosys maps a wider product onto several
and adds their outputs in the same cycle, after the multipliers' own delay: the slowest
path of a design. ``split_product`` instead registers each half's product and adds them
in the next cycle.
"""

from amaranth.hdl import ClockSignal, Instance, Mux, Signal, signed

__all__ = ["MULTIPLIER_BITS", "product_stages", "product_terms", "split_product", "nibble_products",
           "lut_product", "operand_product", "dsp_product", "operand_terms", "tree_sum"]

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
    return _terms(m, a, b, enable, width, name, multiply=lambda x, y, _: x * y, hold=lambda value, _: value)


def _register(m, value, enable, shape, name):
    """``value`` in a register of ``shape`` (moving on ``enable``)."""
    register = Signal(shape, name=name)
    with m.If(enable):
        m.d.sync += register.eq(value)
    return register


def _terms(m, a, b, enable, width, name, *, multiply, hold):
    """The terms of :func:`product_terms`, with ``multiply(x, y, name)`` the product of two
    operands and ``hold(value, name)`` an operand as the multipliers see it."""
    def registered(value, term_name, term_width=width):
        return _register(m, value, enable, signed(term_width), term_name)

    if product_stages(len(a), a.shape().signed) == 1:
        return [registered(multiply(a, b, f"{name}_multiplier"), name)]
    high_part = a[LOW_BITS:].as_signed() if a.shape().signed else a[LOW_BITS:]
    if len(high_part) <= SHIFT_ADD_BITS:
        # A few high bits: a sum of shifted copies of `b` costs less than a multiplier.
        high_bits, b_bits = hold(high_part, f"{name}_high_bits"), hold(b, f"{name}_b")
        terms = [Mux(high_bits[i], b_bits << i, 0) for i in range(len(high_bits))]
        if a.shape().signed:
            terms[-1] = -terms[-1]  # the sign bit weighs −2^i
        high_product = sum(terms)
    else:
        high_product = multiply(high_part, b, f"{name}_high_multiplier")
    low = registered(multiply(a[:LOW_BITS], b, f"{name}_low_multiplier"), f"{name}_low", LOW_BITS + len(b) + 1)
    return [low, registered(high_product, f"{name}_high") << LOW_BITS]


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


def lut_product(a, b, *, name):
    """``a · b`` for an 8-bit signed ``b``, made of LUT logic and registered, as the two partial
    products of :func:`nibble_products`. Returns the register assignments (for the caller's
    domain and enable) and the terms the product is the sum of, to be added where the product
    is used. (A product in a DSP block: :func:`operand_product`.)"""
    low = Signal(signed(len(a) + 5), name=f"{name}_low")
    high = Signal(signed(len(a) + 4), name=f"{name}_high")
    low_part, high_part = nibble_products(a, b)
    return [low.eq(low_part), high.eq(high_part)], [low, high << 4]


def operand_product(m, platform, a, b, *, enable=1, name):
    """``a · b`` as ``a`` and ``b`` were a cycle earlier: the product of two operand registers
    (moving on ``enable``), not itself registered.

    On an ECP5, where both fit one multiplier, the operand registers are the multiplier's own
    (``MULT18X18D`` with its A and B input registers): the long route into a multiplier then
    ends in a register, and only the multiplier's delay and the route out lie between it and
    the next. Elsewhere (simulation), and for wider operands, two registers do the same.
    """
    width = len(a) + len(b) + (0 if a.shape().signed or b.shape().signed else 1)
    fits = all(product_stages(len(operand), operand.shape().signed) == 1 for operand in (a, b))
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
    """``a · b`` from operand registers of its own (:func:`operand_product`, moving on
    ``enable``), registered: as :func:`lut_product` gives it, the register assignments (for the
    caller's domain and enable) and the product's one term."""
    product = Signal(signed(len(a) + len(b)), name=name)
    return [product.eq(operand_product(m, platform, a, b, enable=enable, name=f"{name}_multiplier"))], [product]


def operand_terms(m, platform, a, b, enable, width, name):
    """As :func:`product_terms`, but of operands not yet registered: ``a`` and ``b`` go into
    operand registers (a multiplier's own, see :func:`operand_product`), the terms of ``a · b``
    into registers a cycle later, all moving on ``enable``. ``b`` must fit a multiplier."""
    return _terms(m, a, b, enable, width, name,
                  hold=lambda value, register_name: _register(m, value, enable, value.shape(), register_name),
                  multiply=lambda x, y, multiplier_name: operand_product(m, platform, x, y, enable=enable,
                                                                         name=multiplier_name))
