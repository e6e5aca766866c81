"""The integer arithmetic the hardware is made of, decided before any hardware exists.

A requant rule and the table of its results, a product cut into pieces that each fit a
multiplier, the canonical signed digits of a constant: the plan sizes and counts with these,
and the hardware builds from the same functions, so that what the plan counts is what the
design instantiates.
"""

from dataclasses import dataclass

from int8model.bounds import Bound, signed_bits

__all__ = ["Rule", "LoadedRule", "ResultTable", "multiplier_bits", "signed_digits", "constant_requant_latency",
           "MULTIPLIER_BITS", "LOW_BITS", "SHIFT_ADD_BITS", "Piece", "pieces", "product_stages",
           "ProductTerm", "product_terms", "piece_value", "constant_product_terms", "product_multipliers",
           "saturating_gap"]


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
        ``floor(p / 2^(a + b))``, and a ReLU gives the same after a shift as before it."""
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
        """The rule on one integer."""
        out = (int(value) * self.multiplier) >> self.shift
        if self.relu:
            out = max(out, 0)
        if self.saturate:
            out = min(max(out, -128), 127)
        return out


@dataclass(frozen=True)
class LoadedRule:
    """A requant rule of a loadable build: its ReLU and saturation are the stage's (the format's),
    its multiplier (``multiplier_bits`` signed) and shift (0..63) come from registers the load
    writes. ``result``: the range its results stay in for every model the build's limits admit
    (``None``: as its clamps leave the product), the limits' check having held the model to it."""
    multiplier_bits: int
    relu: bool = False
    saturate: bool = True
    result: Bound | None = None

    @property
    def multiplier_bound(self):
        return Bound.signed(self.multiplier_bits)

    def product_bound(self, bound):
        return bound * self.multiplier_bound

    def sum_bound(self, bound, addend=None):
        """The range of ``(x · M >> S) + addend``: any shift of a product stays within the
        product's range, which holds 0. A loaded rule adds after its shift (the shift is not a
        constant, so the addend is not shifted up to meet the product)."""
        return self.product_bound(bound) + (addend or Bound(0, 0))

    def result_bound(self, bound, addend=None):
        if self.result is not None:
            return self.result
        out = self.sum_bound(bound, addend)
        if self.relu:
            out = out.clamp(0, max(out.hi, 0))
        if self.saturate:
            out = out.clamp(-128, 127)
        return out


def multiplier_bits(rules):
    """The width of a signal that holds any of the rules' multipliers."""
    return max(r.multiplier_bits if isinstance(r, LoadedRule) else signed_bits(r.multiplier, r.multiplier)
               for r in rules)


@dataclass(frozen=True)
class ResultTable:
    """A :class:`Rule` applied by a table of its results, for inputs of a narrow range.

    Of the inputs in ``in_bound``, those up to ``first`` all give the result ``low``, and those
    from ``last`` on the result ``high``: the table holds the results between, indexed by an
    input's ``index_bits`` low bits (``entries``, one per index). A saturating rule on a small
    range (the hidden stage's ``r_hid`` on the ReLU's output) leaves few entries between its two
    constant runs; a requant takes such a table where it needs at most ``LIMIT``.
    """
    in_bound: Bound
    rule: Rule
    first: int
    last: int
    low: int
    high: int
    index_bits: int
    entries: tuple
    out_bound: Bound

    LIMIT = 256  # entries: each result bit a function of eight bits, a few LUT4s

    @classmethod
    def of(cls, in_bound, rule):
        first, last = cls.span(in_bound, rule)
        index_bits = max(1, (last - first).bit_length())
        entries = [0] * (1 << index_bits)
        for x in range(first, last + 1):
            entries[x % len(entries)] = rule.apply(x)
        return cls(in_bound, rule, first, last, rule.apply(in_bound.lo), rule.apply(in_bound.hi), index_bits,
                   tuple(entries), rule.result_bound(in_bound))

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
    def size(cls, in_bound, rule):
        """How many entries the table of ``rule`` on ``in_bound`` would hold."""
        first, last = cls.span(in_bound, rule)
        return last - first + 1


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


# A rule applied in logic by shifts and adds adds its terms four at a time into registers.
CONSTANT_FAN_IN = 4


def constant_requant_latency(rules):
    """The registers of a chain of rules applied in logic (:class:`hdl.requant.ConstantRequant`):
    for each rule, one per round of adding its terms ``CONSTANT_FAN_IN`` at a time while more
    than two are left, and one for its result."""
    stages = 0
    for rule in rules:
        terms = len(signed_digits(rule.multiplier))
        while terms > 2:
            terms = -(-terms // CONSTANT_FAN_IN)
            stages += 1
        stages += 1
    return stages


# -- Products and the multipliers they take.
#
# An ECP5 multiplier (MULT18X18D) takes two 18-bit signed operands. A wider operand is cut into
# pieces: 17 low bits at a time (unsigned), then the rest (signed where the operand is). Every
# pair of pieces is a product of its own, registered, and the pieces' products are added where
# the product is used: Yosys would otherwise cut it itself and add the partial products in the
# same cycle, after the multipliers' own delay.

MULTIPLIER_BITS = 18
LOW_BITS = MULTIPLIER_BITS - 1  # a low piece goes in unsigned, so one bit less
SHIFT_ADD_BITS = 3  # a top piece this narrow is a sum of shifted copies of the other operand
# Yosys maps a product to a multiplier only where both operands are at least this wide.
NARROWEST_MULTIPLIED = 2


@dataclass(frozen=True)
class Piece:
    low: int      # the piece's lowest bit in its operand
    bits: int
    signed: bool


def pieces(bits, signed):
    """An operand of ``bits`` cut into pieces that each fit a multiplier."""
    out, low = [], 0
    while bits - low + (0 if signed else 1) > MULTIPLIER_BITS:
        out.append(Piece(low, LOW_BITS, False))
        low += LOW_BITS
    out.append(Piece(low, bits - low, signed))
    return out


def product_stages(a_bits, signed=True):
    """Cycles from registered operands to a registered product: 1 where the operand fits a
    multiplier, else 2 (the pieces' products, then their sum)."""
    return 1 if len(pieces(a_bits, signed)) == 1 else 2


@dataclass(frozen=True)
class ProductTerm:
    """One term of a product cut into pieces: ``a``'s piece times ``b``'s, shifted up by both
    pieces' ``low``. ``kind``: ``"multiplier"`` (a DSP block), or ``"shifts"`` (a sum of
    shifted copies of one piece, by the bits of the other: where that one is narrow, or, for a
    constant, has a single signed digit)."""
    a: Piece
    b: Piece
    kind: str

    @property
    def multipliers(self):
        return int(self.kind == "multiplier")


def product_terms(a_bits, a_signed, b_bits, b_signed):
    """The terms ``a · b`` is made of, for two operands that are signals."""
    a_pieces, b_pieces = pieces(a_bits, a_signed), pieces(b_bits, b_signed)
    terms = []
    for index, a in enumerate(a_pieces):
        for b in b_pieces:
            narrow = (index > 0 and a.bits <= SHIFT_ADD_BITS) or min(a.bits, b.bits) < NARROWEST_MULTIPLIED
            terms.append(ProductTerm(a, b, "shifts" if narrow else "multiplier"))
    return terms


def piece_value(constant, piece):
    """The value of ``constant``'s ``piece`` (negative where a signed top piece says so)."""
    value = (constant >> piece.low) & ((1 << piece.bits) - 1)
    if piece.signed and value >> (piece.bits - 1):
        value -= 1 << piece.bits
    return value


def constant_product_terms(a_bits, a_signed, constant):
    """The terms of ``a · constant``: per piece of the constant, none where it is 0, shifts
    where it has a single signed digit (± a power of two), else as for a signal."""
    terms = []
    for term in product_terms(a_bits, a_signed, signed_bits(constant, constant), True):
        value = piece_value(constant, term.b)
        if value == 0:
            continue
        if len(signed_digits(value)) == 1:
            term = ProductTerm(term.a, term.b, "shifts")
        terms.append(term)
    return terms


def product_multipliers(a_bits, a_signed, b_bits, b_signed):
    """The multipliers (DSP blocks) of ``a · b``."""
    return sum(term.multipliers for term in product_terms(a_bits, a_signed, b_bits, b_signed))


def saturating_gap(rule, nlut, most):
    """The least gap from which on every gap reads the same exp table entry (``most`` at the
    highest): ``clamp(rq(gap, M_score), 0, nlut − 1)`` only grows with the gap for a positive
    multiplier (and is 0 for any other), so a gap clamped to it reads what it would."""
    if rule.multiplier <= 0:
        return 0
    return min(most, -(-((nlut - 1) << rule.shift) // rule.multiplier))
