from dataclasses import dataclass

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from int8model.bounds import Bound, signed_bits

from .fifo import SkidBuffer
from .product import operand_terms, product_terms

__all__ = ["Rule", "Requant", "ResultTable", "multiplier_bits"]


@dataclass(frozen=True)
class Rule:
    """One requant: ``(x · multiplier) >> shift``, then optionally ReLU, then optionally int8 saturation."""
    multiplier: int
    shift: int
    relu: bool = False
    saturate: bool = True

    @classmethod
    def to8(cls, pair):
        return cls(pair[0], pair[1])

    @classmethod
    def rq(cls, pair, relu=False):
        return cls(pair[0], pair[1], relu=relu, saturate=False)

    def product_bound(self, bound):
        return bound.times(self.multiplier)

    def sum_bound(self, bound, addend=None):
        """The range of ``x · multiplier + (addend << shift)``: adding ``addend`` after the shift
        is adding it, shifted up, before (its low bits are zero, so the floor is the same)."""
        addend = addend or Bound(0, 0)
        return self.product_bound(bound) + Bound(addend.lo << self.shift, addend.hi << self.shift)

    def result_bound(self, bound, addend=None):
        """The results' range for inputs in ``bound`` (each with an ``addend`` in its range,
        added after the shift)."""
        out = self.sum_bound(bound, addend) >> self.shift
        if self.relu:
            out = out.clamp(0, max(out.hi, 0))
        if self.saturate:
            out = out.clamp(-128, 127)
        return out

    def then(self, last):
        """This rule followed by ``last``, as one rule, or ``None`` where they do not compose.

        They compose where this rule does not saturate and ``last`` multiplies by a power of
        two, ``2^k``, and shifts by at least ``k``: ``floor(floor(p / 2^a) / 2^b)`` is
        ``floor(p / 2^(a + b))``, and a ReLU gives the same after a shift as before it. The
        result is one requant where the two took two in a chain."""
        k = last.multiplier.bit_length() - 1
        if self.saturate or last.multiplier <= 0 or last.multiplier != 1 << k or last.shift < k:
            return None
        shift = self.shift + last.shift - k
        if shift > 63:
            return None
        return Rule(self.multiplier, shift, relu=self.relu or last.relu, saturate=last.saturate)

    def is_identity_on(self, bound):
        """Whether the rule gives back every value in ``bound`` unchanged (as ``r_ctx`` = (1, 0)
        does on the softmax's int8 context)."""
        if self.multiplier != 1 << self.shift:
            return False
        if self.relu and bound.lo < 0:
            return False
        return not self.saturate or (bound.lo >= -128 and bound.hi <= 127)

    def apply(self, value):
        """The rule on one integer, at elaboration (for tables of constants)."""
        out = (int(value) * self.multiplier) >> self.shift
        if self.relu:
            out = max(out, 0)
        if self.saturate:
            out = min(max(out, -128), 127)
        return out


def multiplier_bits(rules):
    """The width of a signal that holds any of the rules' multipliers."""
    return max(signed_bits(r.multiplier, r.multiplier) for r in rules)


class Requant(wiring.Component):
    """Requantisation, ``rq`` and ``to8`` of docs/semantics.md, exact for any ``(M, S)`` with S in 0..63.

    The unit holds a table of :class:`Rule` (constants of the model); each input picks one with
    ``select``. The product is computed at the width that the input's bound times the rule's
    multiplier needs, so nothing the model can produce overflows; the arithmetic shift floors
    toward −∞ as the reference's does.

    Parameters
    ----------
    in_bound : :class:`~int8model.bounds.Bound`, or a list of them
        The range of every input value; or, one per rule, the range of the values that take
        that rule (a tighter bound on the results where the rules see different ranges).
    rules : list of :class:`Rule`
    tag_shape : shape-like
        A side-band payload carried unchanged from input to output (routing information).
    registered_input : bool
        The input's payload and valid come straight from registers (a producer's pipeline
        register or register slice): the multiplier then takes them as they are, a cycle
        earlier, instead of registering them first.
    multiplier_input : bool
        Each input carries its rule's ``multiplier`` (the producer looked it up ahead, from
        registers): the multiplier then takes it as it is, not through a table of the rules.
    addend_bounds : list of :class:`~int8model.bounds.Bound` or ``None``, one per rule
        Where given, each input carries an ``addend``, added to the result after the shift and
        before the ReLU and the clamps: ``clamp((x · M >> S) + addend)``, in the same stages
        (added before the shift, shifted up). The range of the addends of that rule's inputs
        (``None``: it adds none, and its inputs' addend must be 0).
    sum_stage : bool
        The product's terms (its halves, the addend) are added up into a register of their
        own, and the shift and the clamps follow in the next stage: one cycle more, for a
        requant whose sum lies far from its multipliers (the route, the sum, the shift and the
        clamps in one cycle were the 85F's critical path in the epilogue).
    followed_by : list of :class:`Rule` or ``None``, one per rule
        Where given, that rule is applied to the rule's results as well, in the same last
        stage, by a :class:`ResultTable` read from the sum's bits: ``then(rule(x))`` at no cost
        in cycles. Only after a rule that does not saturate (its results are then the shifted
        sum's, or 0 where the ReLU takes them), and only where the table's entries are at most
        :attr:`ResultTable.LIMIT`.

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"value", "tag", "select"})))``
        ``select`` (the rule) only where there is more than one rule; ``addend`` only with
        ``addend_bounds``.
    o : ``Out(stream.Signature(StructLayout({"value", "tag", "select"})))``
        ``value`` is signed, as wide as the widest result of any rule; ``tag`` and ``select``
        (not ``addend`` or ``multiplier``) pass through, so that units in a chain can share one rule index.

    Latency 3 cycles (2 where every rule's multiplier is a power of two or 0; one less with
    ``registered_input``, one more with ``sum_stage``), also for inputs wider than a
    multiplier's 18 bits, whose product's two halves (see :mod:`.product`) are added in the
    last stage, throughput one value per cycle; a stalled output holds the whole pipeline
    (after one more value, which waits in the output's register slice).
    """

    def __init__(self, in_bound, rules, *, tag_shape=unsigned(0), registered_input=False, addend_bounds=None,
                 multiplier_input=False, sum_stage=False, followed_by=None):
        self.registered_input = registered_input
        self.sum_stage = sum_stage
        self.rules = list(rules)
        if not self.rules:
            raise ValueError("a requant unit needs at least one rule")
        for rule in self.rules:
            if not 0 <= rule.shift <= 63:
                raise ValueError(f"shift {rule.shift} is outside 0..63")
        rule_bounds = list(in_bound) if isinstance(in_bound, (list, tuple)) else [in_bound] * len(self.rules)
        if len(rule_bounds) != len(self.rules):
            raise ValueError(f"{len(rule_bounds)} input bounds for {len(self.rules)} rules")
        self.in_bound = Bound(min(b.lo for b in rule_bounds), max(b.hi for b in rule_bounds))
        self.in_bits = self.in_bound.bits
        self.addend_bounds = list(addend_bounds) if addend_bounds is not None else None
        if self.addend_bounds is not None and len(self.addend_bounds) != len(self.rules):
            raise ValueError(f"{len(self.addend_bounds)} addend bounds for {len(self.rules)} rules")
        addends = self.addend_bounds or [None] * len(self.rules)
        self.product_bits = max(rule.sum_bound(b, a).bits for rule, b, a in zip(self.rules, rule_bounds, addends))
        results = [rule.result_bound(b, a) for rule, b, a in zip(self.rules, rule_bounds, addends)]
        self.tables = [None] * len(self.rules)
        for index, then in enumerate(followed_by or []):
            if then is None:
                continue
            if self.rules[index].saturate:
                raise ValueError(f"rule {index} saturates: no table can follow it")
            entries = ResultTable.entries(results[index], then)
            if entries > ResultTable.LIMIT:
                raise ValueError(f"rule {index}'s table would take {entries} entries, more than "
                                 f"{ResultTable.LIMIT}")
            self.tables[index] = ResultTable(results[index], then)
            results[index] = self.tables[index].out_bound
        self.out_bound = Bound(min(r.lo for r in results), max(r.hi for r in results))
        self.out_bits = self.out_bound.bits
        self.multiplier_bits = multiplier_bits(self.rules)
        self.shift_only = all(r.multiplier >= 0 and r.multiplier & (r.multiplier - 1) == 0 for r in self.rules)
        self.tag_shape = tag_shape
        inputs = {"value": signed(self.in_bits), "tag": tag_shape}
        if len(self.rules) > 1:
            inputs["select"] = range(len(self.rules))
        if self.addend_bounds is not None:
            inputs["addend"] = signed(max((a or Bound(0, 0)).bits for a in self.addend_bounds))
        self.multiplier_input = multiplier_input
        if multiplier_input:
            inputs["multiplier"] = signed(self.multiplier_bits)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout(inputs))),
            "o": Out(stream.Signature(data.StructLayout(
                {name: shape for name, shape in dict(inputs, value=signed(self.out_bits)).items()
                 if name not in ("addend", "multiplier")}))),
        })

    def multiplier_of(self, select):
        """The multiplier of rule ``select``, from a table of the rules (the input's
        ``multiplier`` where a producer looks it up ahead)."""
        return Array(Const(r.multiplier, signed(self.multiplier_bits)) for r in self.rules)[select]

    def elaborate(self, platform):
        m = Module()
        rules = self.rules

        # One global enable: every stage moves when the last stage is empty or being taken.
        advance = Signal()

        # Stage 1: register the operand and the rule's multiplier (so the product sees registers).
        value = Signal(signed(self.in_bits))
        multiplier = Signal(signed(self.multiplier_bits))
        select = self.i.payload.select if len(rules) > 1 else 0
        select1 = Signal(range(len(rules)))
        tag1 = Signal(self.tag_shape)
        valid1 = Signal()
        addend = Signal(signed(self.product_bits))
        multiplier_in = self.i.payload.multiplier if self.multiplier_input else self.multiplier_of(select)
        stage1 = [
            addend.eq(self.i.payload.addend if self.addend_bounds is not None else 0),
            value.eq(self.i.payload.value),
            multiplier.eq(multiplier_in),
            select1.eq(select),
            tag1.eq(self.i.payload.tag),
            valid1.eq(self.i.valid),
        ]
        if self.registered_input:
            m.d.comb += stage1  # the producer's registers are stage 1
        else:
            with m.If(advance):
                m.d.sync += stage1

        # Stage 2: the exact product (for an input wider than a multiplier, its two halves);
        # none where every multiplier is a power of two (or 0): the product is then a shift.
        # The addend goes up by the rule's shift beside it (a multiplexer of constant shifts).
        select2, tag2, valid2 = select1, tag1, valid1
        adds = self.addend_bounds or [None] * len(rules)
        shifted_addend = Array(addend << r.shift if a is not None else Const(0) for r, a in zip(rules, adds))[select1]
        product = Signal(signed(self.product_bits))
        if self.shift_only:
            m.d.comb += product.eq(Array(value << (r.multiplier.bit_length() - 1) if r.multiplier else Const(0)
                                         for r in rules)[select1] + shifted_addend)
            product_cycles = 0
        else:
            if self.registered_input:
                terms = product_terms(m, value, multiplier, advance, self.product_bits, "product")
            else:
                # Stage 1's value and multiplier are the multipliers' own operand registers.
                terms = operand_terms(m, platform, self.i.payload.value, multiplier_in, advance, self.product_bits,
                                      "product")
            if self.addend_bounds is not None:
                addend2 = Signal(signed(self.product_bits), name="addend2")
                with m.If(advance):
                    m.d.sync += addend2.eq(shifted_addend)
                terms.append(addend2)
            m.d.comb += product.eq(sum(terms[1:], terms[0]))
            product_cycles = 1
        # The rule, tag and valid flag follow the product, as many cycles later.
        for stage in range(product_cycles):
            later = (Signal.like(select1, name=f"select2_{stage}"),
                     Signal(self.tag_shape, name=f"tag2_{stage}"), Signal(name=f"valid2_{stage}"))
            with m.If(advance):
                m.d.sync += [later[0].eq(select2), later[1].eq(tag2), later[2].eq(valid2)]
            select2, tag2, valid2 = later

        if self.sum_stage:
            summed = Signal.like(product, name="summed")
            later = (Signal.like(select1, name="select3"), Signal(self.tag_shape, name="tag3"), Signal(name="valid3"))
            with m.If(advance):
                m.d.sync += [summed.eq(product), later[0].eq(select2), later[1].eq(tag2), later[2].eq(valid2)]
            product = summed
            select2, tag2, valid2 = later

        # Stage 3: the sum of the halves (and the addend; a stage before with sum_stage), the
        # rule's shift (a constant per rule, so a multiplexer, not a shifter) and, beside it,
        # the rule's clamps judged on the product's bits, with no comparison: `p >> s` is at
        # least 128 when p is positive and a bit from s + 7 up is set, below −128 when p is
        # negative and one is clear. Then a register slice, so that the pipeline's enable comes
        # from registers and the consumer's readiness goes no further than the slice.
        negative = product[-1]
        shifted = Array(product >> rule.shift for rule in rules)[select2]
        to_zero = Array(Const(rule.relu) & negative for rule in rules)[select2]
        to_high = Array(Const(rule.saturate) & ~negative & product[rule.shift + 7:].any() for rule in rules)[select2]
        to_low = Array(Const(rule.saturate) & negative & ~product[rule.shift + 7:].all() for rule in rules)[select2]
        result = Mux(to_zero, 0, Mux(to_high, 127, Mux(to_low, -128, shifted)))
        if any(self.tables):
            # A rule followed by a table reads it from its own shifted sum (wiring, as its shift
            # is a constant). Under a ReLU the table's first entry is at least 0, so the negative
            # sums that the ReLU makes 0 fall below it, with 0's result.
            tabled = Array(Const(table is not None) for table in self.tables)[select2]
            looked_up = Array(Const(0) if table is None else table.lookup(product >> rule.shift)
                              for rule, table in zip(rules, self.tables))[select2]
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


class ResultTable:
    """A :class:`Rule` applied by a table of its results, for inputs of a narrow range: a LUT
    ROM and a comparison at each end, no multiplier.

    Of the inputs in ``in_bound``, those up to ``first`` all give the same result, and so do
    those from ``last`` on: the table holds the results between (a saturating rule on a small
    range, the hidden stage's ``r_hid`` on the ReLU's output, leaves few entries between its two
    constant runs). :meth:`entries` says how many a rule would take; :class:`Requant` takes
    one, in its last stage, where that is at most ``LIMIT``.
    """

    LIMIT = 256  # entries: each result bit a function of eight bits, a few LUT4s

    def __init__(self, in_bound, rule):
        self.in_bound, self.rule = in_bound, rule
        self.first, self.last = self.span(in_bound, rule)
        self.out_bound = rule.result_bound(in_bound)

    @staticmethod
    def span(in_bound, rule):
        """The inputs whose results the table holds: past them, on each side, the result is
        that of the end of ``in_bound``. Found from the rule's monotony (``x · M >> S`` moves one
        way, and so do the ReLU and the clamps) by bisection."""
        def search(lo, hi, same):  # the least x in lo..hi with same(x), hi itself if none before
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if same(mid) else (mid + 1, hi)
            return lo
        low_result, high_result = rule.apply(in_bound.lo), rule.apply(in_bound.hi)
        last = search(in_bound.lo, in_bound.hi, lambda x: rule.apply(x) == high_result)
        # The greatest x with the low end's result: the least from which it differs, less one.
        first = search(in_bound.lo, last, lambda x: rule.apply(x) != low_result) - 1
        return max(first, in_bound.lo), last

    @classmethod
    def entries(cls, in_bound, rule):
        first, last = cls.span(in_bound, rule)
        return last - first + 1

    def lookup(self, value):
        """The rule's result for ``value`` (a signed value of ``in_bound``, at any width), as an
        expression. The table is indexed by the value's low bits, not by its distance from
        ``first`` (a subtraction before the table took a carry chain): as many bits as tell the
        span's inputs apart. The ends are judged by logic on the value's bits, not by
        comparisons, which Yosys builds as carry chains (the 85F's critical path, with the
        table's multiplexers after it)."""
        index_bits = max(1, (self.last - self.first).bit_length())
        entries = [0] * (1 << index_bits)
        for x in range(self.first, self.last + 1):
            entries[x % len(entries)] = self.rule.apply(x)
        table = Array(Const(v, signed(self.out_bound.bits)) for v in entries)
        return Mux(at_most(value, self.first), self.rule.apply(self.in_bound.lo),
                   Mux(~at_most(value, self.last - 1), self.rule.apply(self.in_bound.hi),
                       table[value[:index_bits]]))


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


def signed_digits(value):
    """``value`` in canonical signed digits: ``(shift, sign)`` pairs with
    ``value == Σ sign · 2**shift``, no two of them at adjacent shifts (the fewest terms)."""
    digits, shift = [], 0
    while value:
        if value & 1:
            digit = 2 - (value & 3)  # +1 where value ≡ 1 (mod 4), −1 where value ≡ 3
            digits.append((shift, digit))
            value -= digit
        value >>= 1
        shift += 1
    return digits


class ConstantRequant:
    """The rules of a chain applied to one value in LUT logic: each product by its constant
    multiplier as a sum of shifted copies (:func:`signed_digits`), no multiplier.

    For the values that a whole group of MAC lanes makes at once, more than a part has
    multipliers for. Each rule takes stages of its own: its terms added four at a time into
    registers until two remain, then their sum, the shift, the ReLU and the clamps, into the
    next rule's input register (the chain's output, ``result``, after the last). The
    registers move on ``enable``; ``stages`` counts them.
    """

    FAN_IN = 4  # terms added into one register: two levels of adders

    def __init__(self, m, value, bound, rules, *, enable=1, name):
        for index, rule in enumerate(rules):
            value, bound = self._apply(m, value, bound, rule, enable, f"{name}_{index}")
        self.result, self.bound = value, bound
        self.stages = self.latency(rules)

    @classmethod
    def latency(cls, rules):
        """The chain's registers: for each rule, one per round of adding its terms
        ``FAN_IN`` at a time while more than two are left, and one for its result."""
        stages = 0
        for rule in rules:
            terms = len(signed_digits(rule.multiplier))
            while terms > 2:
                terms = -(-terms // cls.FAN_IN)
                stages += 1
            stages += 1
        return stages

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
