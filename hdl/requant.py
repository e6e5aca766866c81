from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from plan.arithmetic import CONSTANT_FAN_IN, constant_requant_latency, signed_digits

from .fifo import SkidBuffer
from .product import operand_terms, product_terms

__all__ = ["Requant", "table_lookup", "at_most", "shifted_clamp", "ConstantRequant"]


class Requant(wiring.Component):
    """Requantisation, ``rq`` and ``to8`` of docs/semantics.md, exact for any ``(M, S)`` with S in 0..63.

    The unit holds a table of :class:`plan.arithmetic.Rule` (constants of the model); each input picks one with
    ``select``. The product is computed at the width that the input's bound times the rule's
    multiplier needs, so nothing the model can produce overflows; the arithmetic shift floors
    toward −∞ as the reference's does.

    Parameters
    ----------
    plan : :class:`plan.requant.RequantPlan`
        The rules (each a table of its results after it where the plan says so), the range of
        each rule's inputs and addends, and the pipeline's options: ``registered_input`` (the
        input's payload and valid come straight from registers, a producer's pipeline register
        or register slice: the multiplier takes them as they are, a cycle earlier),
        ``multiplier_input`` (each input carries its rule's ``multiplier``, looked up ahead by
        the producer from registers: not through a table of the rules), ``sum_stage`` (the
        product's terms, its pieces and the addend, are added up into a register of their own,
        the shift and the clamps in the next stage: for a requant whose sum lies far from its
        multipliers). An ``addend`` is added after the shift and before the ReLU and the
        clamps, ``clamp((x · M >> S) + addend)`` (added before the shift, shifted up).
    tag_shape : shape-like
        A side-band payload carried unchanged from input to output (routing information).

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"value", "tag", "select"})))``
        ``select`` (the rule) only where there is more than one rule; ``addend`` only where
        the plan has addend bounds; ``multiplier`` only with ``multiplier_input``.
    o : ``Out(stream.Signature(StructLayout({"value", "tag", "select"})))``
        ``value`` is signed, as wide as the widest result of any rule; ``tag`` and ``select``
        (not ``addend`` or ``multiplier``) pass through, so that units in a chain can share one rule index.

    Latency ``plan.latency``: 3 cycles (2 where every rule's multiplier is a power of two or 0;
    one less with ``registered_input``, one more with ``sum_stage``), also for operands wider
    than a multiplier's 18 bits, whose product's pieces (see :mod:`.product`) are added in the
    last stage; throughput one value per cycle; a stalled output holds the whole pipeline
    (after one more value, which waits in the output's register slice).
    """

    def __init__(self, plan, *, tag_shape=unsigned(0)):
        self.plan = plan
        self.rules = list(plan.rules)
        self.tag_shape = tag_shape
        inputs = {"value": signed(plan.in_bits), "tag": tag_shape}
        if len(self.rules) > 1:
            inputs["select"] = range(len(self.rules))
        if plan.addend_bounds is not None:
            inputs["addend"] = signed(plan.addend_bits)
        if plan.multiplier_input:
            inputs["multiplier"] = signed(plan.multiplier_bits)
        if plan.loaded:
            inputs["shift"] = unsigned(plan.SHIFT_BITS)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout(inputs))),
            "o": Out(stream.Signature(data.StructLayout(
                {name: shape for name, shape in dict(inputs, value=signed(plan.out_bits)).items()
                 if name not in ("addend", "multiplier", "shift")}))),
        })

    def multiplier_of(self, select):
        """The multiplier of rule ``select``, from a table of the rules (the input's
        ``multiplier`` where a producer looks it up ahead)."""
        return Array(Const(r.multiplier, signed(self.plan.multiplier_bits)) for r in self.rules)[select]

    def elaborate(self, platform):
        m = Module()
        rules = self.rules

        # One global enable: every stage moves when the last stage is empty or being taken.
        advance = Signal()

        # Stage 1: register the operand and the rule's multiplier (so the product sees registers).
        value = Signal(signed(self.plan.in_bits))
        multiplier = Signal(signed(self.plan.multiplier_bits))
        select = self.i.payload.select if len(rules) > 1 else 0
        select1 = Signal(range(len(rules)))
        tag1 = Signal(self.tag_shape)
        valid1 = Signal()
        addend = Signal(signed(self.plan.product_bits))
        multiplier_in = self.i.payload.multiplier if self.plan.multiplier_input else self.multiplier_of(select)
        loaded = self.plan.loaded
        shift = Signal(unsigned(self.plan.SHIFT_BITS))
        stage1 = [
            *([shift.eq(self.i.payload.shift)] if loaded else []),
            addend.eq(self.i.payload.addend if self.plan.addend_bounds is not None else 0),
            value.eq(self.i.payload.value),
            multiplier.eq(multiplier_in),
            select1.eq(select),
            tag1.eq(self.i.payload.tag),
            valid1.eq(self.i.valid),
        ]
        if self.plan.registered_input:
            m.d.comb += stage1  # the producer's registers are stage 1
        else:
            with m.If(advance):
                m.d.sync += stage1

        # Stage 2: the exact product (for an input wider than a multiplier, its two halves);
        # none where every multiplier is a power of two (or 0): the product is then a shift.
        # The addend goes up by the rule's shift beside it (a multiplexer of constant shifts).
        select2, tag2, valid2 = select1, tag1, valid1
        adds = self.plan.addend_bounds or [None] * len(rules)
        if loaded:  # added after the shift, which is not a constant
            shifted_addend = Const(0)
        else:
            shifted_addend = Array(addend << r.shift if a is not None else Const(0)
                                   for r, a in zip(rules, adds))[select1]
        product = Signal(signed(self.plan.product_bits))
        if self.plan.shift_only:
            m.d.comb += product.eq(Array(value << (r.multiplier.bit_length() - 1) if r.multiplier else Const(0)
                                         for r in rules)[select1] + shifted_addend)
            product_cycles = 0
        else:
            if self.plan.registered_input:
                terms = product_terms(m, value, multiplier, advance, self.plan.product_bits, "product")
            else:
                # Stage 1's value and multiplier are the multipliers' own operand registers.
                terms = operand_terms(m, platform, self.i.payload.value, multiplier_in, advance, self.plan.product_bits,
                                      "product")
            if self.plan.addend_bounds is not None and not loaded:
                addend2 = Signal(signed(self.plan.product_bits), name="addend2")
                with m.If(advance):
                    m.d.sync += addend2.eq(shifted_addend)
                terms.append(addend2)
            m.d.comb += product.eq(sum(terms[1:], terms[0]))
            product_cycles = 1
        # The rule, tag and valid flag follow the product, as many cycles later (a loaded
        # rule's shift and addend too).
        def follow(name):
            nonlocal select2, tag2, valid2, shift, addend
            later = (Signal.like(select1, name=f"select{name}"), Signal(self.tag_shape, name=f"tag{name}"),
                     Signal(name=f"valid{name}"), Signal.like(shift, name=f"shift{name}"),
                     Signal.like(addend, name=f"addend{name}"))
            with m.If(advance):
                m.d.sync += [later[0].eq(select2), later[1].eq(tag2), later[2].eq(valid2)]
                if loaded:
                    m.d.sync += [later[3].eq(shift), later[4].eq(addend)]
            select2, tag2, valid2, shift, addend = later
        for stage in range(product_cycles):
            follow(f"2_{stage}")

        if self.plan.sum_stage:
            summed = Signal.like(product, name="summed")
            with m.If(advance):
                m.d.sync += summed.eq(product)
            product = summed
            follow("3")

        if loaded:
            # A loaded rule's shift, a shifter of its own stage; its addend after it. Any
            # shift of the product stays within its range, and so the sum within product_bits.
            shifted = Signal.like(product, name="shifted")
            with m.If(advance):
                m.d.sync += shifted.eq(product >> shift)
            follow("4")
            product = Signal.like(product, name="shifted_sum")
            m.d.comb += product.eq(shifted + addend)

        # Stage 3: the sum of the halves (and the addend; a stage before with sum_stage), the
        # rule's shift (a constant per rule, so a multiplexer, not a shifter) and, beside it,
        # the rule's clamps judged on the product's bits, with no comparison: `p >> s` is at
        # least 128 when p is positive and a bit from s + 7 up is set, below −128 when p is
        # negative and one is clear. Then a register slice, so that the pipeline's enable comes
        # from registers and the consumer's readiness goes no further than the slice.
        negative = product[-1]
        shifts = [0 if loaded else rule.shift for rule in rules]  # a loaded rule's is applied
        shifted = Array(product >> s for s in shifts)[select2]
        to_zero = Array(Const(rule.relu) & negative for rule in rules)[select2]
        to_high = Array(Const(rule.saturate) & ~negative & product[s + 7:].any() for rule, s in zip(rules, shifts))[select2]
        to_low = Array(Const(rule.saturate) & negative & ~product[s + 7:].all() for rule, s in zip(rules, shifts))[select2]
        result = Mux(to_zero, 0, Mux(to_high, 127, Mux(to_low, -128, shifted)))
        if any(self.plan.tables):
            # A rule followed by a table reads it from its own shifted sum (wiring, as its shift
            # is a constant). Under a ReLU the table's first entry is at least 0, so the negative
            # sums that the ReLU makes 0 fall below it, with 0's result.
            tabled = Array(Const(table is not None) for table in self.plan.tables)[select2]
            looked_up = Array(Const(0) if table is None else table_lookup(table, product >> rule.shift)
                              for rule, table in zip(rules, self.plan.tables))[select2]
            result = Mux(tabled, looked_up, result)
        m.submodules.slice = out = SkidBuffer(self.o.payload.shape())
        wiring.connect(m, out.o, wiring.flipped(self.o))
        m.d.comb += [
            advance.eq(~out.i.valid | out.i.ready),
            self.i.ready.eq(advance),
        ]
        with m.If(advance):
            m.d.sync += [
                out.i.payload.value.eq(result),
                out.i.payload.tag.eq(tag2),
                *([out.i.payload.select.eq(select2)] if len(rules) > 1 else []),
                out.i.valid.eq(valid2),
            ]
        return m


def table_lookup(table, value):
    """A :class:`plan.arithmetic.ResultTable`'s result for ``value`` (a signed value of its input
    range, at any width), as an expression. The table is indexed by the value's low bits, not
    by its distance from ``first`` (a subtraction before the table takes a carry chain). The
    ends are judged by logic on the value's bits (:func:`at_most`), not by comparisons, which
    Yosys builds as carry chains, with the table's multiplexers after them."""
    entries = Array(Const(v, signed(table.out_bound.bits)) for v in table.entries)
    return Mux(at_most(value, table.first), table.low,
               Mux(~at_most(value, table.last - 1), table.high, entries[value[:table.index_bits]]))


def at_most(value, constant):
    """``value <= constant`` for a signed value, as and/or logic on its bits from the lowest
    up (no carry chain: logic that LUT mapping balances)."""
    width = len(value)
    if constant >= (1 << width - 1) - 1:
        return Const(1)
    if constant < -(1 << width - 1):
        return Const(0)
    # As unsigned numbers, both offset by 2**(width − 1): the sign bit inverted.
    unsigned_value, unsigned_constant = Cat(value[:-1], ~value[-1]), constant + (1 << width - 1)
    result = Const(1)  # the bits below the lowest, equal
    for at in range(width):
        bit = unsigned_value[at]
        result = (~bit | result) if unsigned_constant >> at & 1 else (~bit & result)
    return result


def shifted_clamp(m, value, shifts, select, count, name):
    """``clamp(value >> shifts[select], 0, count − 1)`` from registers: the shifted value's low
    bits and whether it is past either end, each judged on ``value``'s bits (:func:`at_most`)
    beside the shift's select, so that only a select follows the registers."""
    bits = max(1, (count - 1).bit_length())
    signed_value = value.as_signed() if value.shape().signed else Cat(value, Const(0, 1)).as_signed()
    low = Signal(bits, name=f"{name}_low")
    below = Signal(name=f"{name}_below")
    above = Signal(name=f"{name}_above")
    m.d.sync += [
        low.eq(Array((value >> shift)[:bits] for shift in shifts)[select]),
        below.eq(signed_value[-1]),  # an arithmetic shift keeps the sign
        above.eq(Array(~at_most(signed_value, (count << shift) - 1) for shift in shifts)[select]),
    ]
    return Mux(below, 0, Mux(above, count - 1, low))


class ConstantRequant:
    """The rules of a chain applied to one value in LUT logic: each product by its constant
    multiplier as a sum of shifted copies (:func:`plan.arithmetic.signed_digits`), no multiplier.

    For the values that a whole group of MAC lanes makes at once, more than a part has
    multipliers for. Each rule takes stages of its own: its terms added four at a time into
    registers until two remain, then their sum, the shift, the ReLU and the clamps, into the
    next rule's input register (the chain's output, ``result``, after the last). The
    registers move on ``enable``; ``stages`` counts them.
    """

    FAN_IN = CONSTANT_FAN_IN  # terms added into one register: two levels of adders

    def __init__(self, m, value, bound, rules, *, enable=1, name):
        for index, rule in enumerate(rules):
            value, bound = self._apply(m, value, bound, rule, enable, f"{name}_{index}")
        self.result, self.bound = value, bound
        self.stages = self.latency(rules)

    @staticmethod
    def latency(rules):
        return constant_requant_latency(rules)

    def _register(self, m, expression, width, enable, name):
        register = Signal(signed(width), name=name)
        with m.If(enable):
            m.d.sync += register.eq(expression)
        return register

    @staticmethod
    def _combine(a, b):
        """Two terms as one. A term ``(value, shift, sign, factor)`` stands for
        ``sign · value · 2**shift``, its value being the rule's input times ``factor``; the
        sum of two is a term whose shift is the lesser, its value their difference where the
        signs differ."""
        (x, x_shift, x_sign, x_factor), (y, y_shift, y_sign, y_factor) = a, b
        base = min(x_shift, y_shift)
        if x_sign < y_sign:
            (x, x_shift, x_sign, x_factor), (y, y_shift, y_sign, y_factor) = b, a
        x_factor, y_factor = x_factor << (x_shift - base), y_factor << (y_shift - base)
        x, y = x << (x_shift - base), y << (y_shift - base)
        if x_sign == y_sign:
            return x + y, base, x_sign, x_factor + y_factor
        return x - y, base, 1, x_factor - y_factor

    def _apply(self, m, value, bound, rule, enable, name):
        # The terms' sums are registered unshifted, each as wide as its factor needs.
        terms = [(value, shift, sign, 1) for shift, sign in signed_digits(rule.multiplier)]

        def total(group):
            while len(group) > 1:
                group = [self._combine(a, b) for a, b in zip(group[0::2], group[1::2])] + group[len(group) & ~1:]
            return group[0]

        level = 0
        while len(terms) > 2:
            grouped = []
            for at in range(0, len(terms), self.FAN_IN):
                sum_, base, sign, factor = total(terms[at:at + self.FAN_IN])
                register = self._register(m, sum_, bound.times(factor).bits, enable, f"{name}_sum{level}_{at}")
                grouped.append((register, base, sign, factor))
            terms = grouped
            level += 1
        product = Signal(signed(rule.product_bound(bound).bits), name=f"{name}_product")
        if terms:
            sum_, base, sign, _ = total(terms)
            m.d.comb += product.eq(sum_ << base if sign > 0 else -(sum_ << base))
        # The clamps judged on the product's bits, as in Requant's last stage.
        negative = product[-1]
        out = rule.result_bound(bound)
        result = product >> rule.shift
        if rule.saturate:
            result = Mux(~negative & product[rule.shift + 7:].any(), 127,
                         Mux(negative & ~product[rule.shift + 7:].all(), -128, result))
        if rule.relu:
            result = Mux(negative, 0, result)
        return self._register(m, result, out.bits, enable, f"{name}_result"), out
