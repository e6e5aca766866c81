from amaranth.hdl import Array, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from int8model.bounds import Bound

from .fifo import SkidBuffer

__all__ = ["FloorDivider"]


class FloorDivider(wiring.Component):
    """Floor division ``num // den`` (``den > 0``), exact for negative numerators.

    The quotient's range is known in advance (the softmax's context is a weighted mean of int8
    values, so it lies between the smallest and the largest of them), which bounds the work:
    the numerator is offset by ``offset · den`` to be non-negative (``offset`` the power of two,
    or 0, at or below ``quotient.lo``: a shift, not a product), and a restoring division finds
    the ``ceil_log2(quotient.hi − offset + 1)`` quotient bits,
    ``bits_per_stage`` per pipeline stage. A stage tries every digit side by side (for two
    bits, ``rem − c · den`` for c in 1, 2, 3, with ``3 · den`` added up once at the input): one
    subtraction deep, not one per bit. No multiplier: every product by a constant is shifts.

    Parameters
    ----------
    plan : :class:`plan.requant.DividerPlan`
        The numerator's, denominator's and quotient's bounds, the offset, the quotient bits
        and ``bits_per_stage``, and the ``rules``: where given, ``value`` is the rule applied to
        the quotient (attention's ``r_ctx``), at no cost in cycles: the last stage looks up the
        rule's result for each digit it may find, from the quotient's bits found before it (a
        table of constants beside the trials), and selects it with the digit. With a rule per
        layer (a deep model's), each division brings its ``layer``, which chooses the rule.
    tag_shape : shape-like, carried unchanged alongside.

    Ports
    -----
    i : ``In(stream.Signature(StructLayout({"num", "den", "tag"})))``, and ``layer`` with a rule per layer
    o : ``Out(stream.Signature(StructLayout({"value", "tag"})))``
        ``value`` is the quotient (or the rule's result on it).

    Latency ``ceil(quotient bits / bits_per_stage)`` cycles (4 for an int8 quotient), where the
    first digit's trials are each the numerator plus one shift of den (else one more, for the
    offset); throughput one division per cycle.
    """

    def __init__(self, plan, *, tag_shape=unsigned(0)):
        self.plan = plan
        self.tag_shape = tag_shape
        self.layers = len(plan.rules) if plan.rules is not None else 1
        layer = {} if self.layers == 1 else {"layer": range(self.layers)}
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({
                "num": signed(plan.num_bound.bits), "den": signed(plan.den_bound.bits), "tag": tag_shape, **layer}))),
            "o": Out(stream.Signature(data.StructLayout({
                "value": signed(plan.value_bound.bits), "tag": tag_shape}))),
        })

    @property
    def latency(self):
        return self.plan.latency

    def elaborate(self, platform):
        m = Module()
        # The output leaves through a skid buffer: the stages' common enable then depends on
        # the buffer's registers, not on the consumer's readiness (which would reach every
        # stage of the divider through it).
        m.submodules.slice = out = SkidBuffer(self.o.payload.shape())
        wiring.connect(m, out.o, wiring.flipped(self.o))
        advance = Signal()
        m.d.comb += [advance.eq(~out.i.valid | out.i.ready), self.i.ready.eq(advance)]

        # The multiples of den a stage tries, c · den for c in 1 .. 2^bits_per_stage − 1.
        digits = range(1, 1 << self.plan.bits_per_stage)
        multiple_bits = Bound(0, digits[-1] * self.plan.den_bound.hi).bits
        den = self.i.payload.den

        def times(k):  # k · den (k ≥ 0) as shifted copies: Yosys would spend a DSP block on a product
            return sum((den << i for i in range(k.bit_length()) if k >> i & 1), Const(0))

        def plus_times(value, k):
            # A subtraction where k < 0, not the sum with a negation: a negation is a carry
            # chain of its own, in series with the sum's.
            return value - times(-k) if k < 0 else value + times(k)
        stage = data.StructLayout({
            "valid": 1, "rem": signed(self.plan.rem_bits + 1),
            "multiples": data.ArrayLayout(signed(multiple_bits), len(digits)),
            "quotient": unsigned(self.plan.steps), "tag": self.tag_shape,
            **({} if self.layers == 1 else {"layer": range(self.layers)}),
            **({} if self.plan.rules is None else {"value": signed(self.plan.value_bound.bits)})})
        bits = list(reversed(range(self.plan.steps)))
        groups = [bits[at:at + self.plan.bits_per_stage] for at in range(0, len(bits), self.plan.bits_per_stage)]

        def results(source, width):
            """For the last stage, for each digit c: the rule's result on the quotient with that
            digit, a table indexed by the quotient's bits found before (``source.quotient``
            holds no others); with a rule per layer, the division's layer's."""
            bits = signed(self.plan.value_bound.bits)
            values = []
            for c in range(1 << width):
                per_layer = []
                for rule in self.plan.rules:
                    table = []
                    for high in range(1 << (self.plan.steps - width)):
                        quotient = (high << width | c) + self.plan.offset
                        if self.plan.quotient_bound.lo <= quotient <= self.plan.quotient_bound.hi:
                            table.append(rule.apply(quotient))
                        else:
                            table.append(0)  # a quotient outside its bound is never found
                    known = source.quotient[width:]
                    per_layer.append(Array(Const(v, bits) for v in table)[known]
                                     if self.plan.steps > width else Const(table[0], bits))
                values.append(per_layer[0] if self.layers == 1 else Array(per_layer)[source.layer])
            return values

        def digit_stage(group, trials, source, multiples):
            """The stage that finds the digit of ``group``'s bits, the largest c whose trial
            (rem − c · 2^low · den, for rem < 2^(low + width) · den) is not negative; the
            last also the rule's result, where there is a rule."""
            low = group[-1]
            applies_rule = low == 0 and self.plan.rules is not None  # the last stage, with a rule
            # A trial fits where its sign bit is clear (not a comparison with 0, which Yosys
            # builds as a second carry chain after the subtraction's).
            fits = [~trial[-1] for trial in trials]

            def pick(choices, lo=0, hi=len(trials) - 1):
                # The trials fit up to the digit and no further, so a search halving the digits
                # finds it: log2 multiplexers deep after the subtractions, not one per digit.
                if lo == hi:
                    return choices[lo]
                mid = (lo + hi + 1) // 2
                return Mux(fits[mid], pick(choices, mid, hi), pick(choices, lo, mid - 1))
            rem, digit = pick(trials), pick([Const(c, len(group)) for c in range(len(trials))])
            if applies_rule:
                value = pick(results(source, len(group)))
            after = Signal(stage, name=f"bit{group[0]}")
            with m.If(advance):
                m.d.sync += [after.valid.eq(source.valid), after.rem.eq(rem),
                             *(after.multiples[c - 1].eq(multiple) for c, multiple in zip(digits, multiples)),
                             after.quotient.eq(source.quotient | (digit << low)), after.tag.eq(source.tag)]
                if self.layers > 1:
                    m.d.sync += after.layer.eq(source.layer)
                if applies_rule:
                    m.d.sync += after.value.eq(value)
            return after

        offset = -self.plan.offset
        entry = Signal(stage, name="entry")  # the input, as a stage (not registered)
        m.d.comb += [entry.valid.eq(self.i.valid), entry.quotient.eq(0), entry.tag.eq(self.i.payload.tag)]
        if self.layers > 1:
            m.d.comb += entry.layer.eq(self.i.payload.layer)
        if self.plan.fused:
            previous = digit_stage(groups[0], [plus_times(self.i.payload.num, k) for k in self.plan.first_trials], entry,
                                   [times(c) for c in digits])
            groups = groups[1:]
        else:
            previous = Signal(stage, name="offset")
            with m.If(advance):
                m.d.sync += [previous.valid.eq(self.i.valid), previous.rem.eq(plus_times(self.i.payload.num, offset)),
                             *(previous.multiples[c - 1].eq(times(c)) for c in digits),
                             previous.quotient.eq(0), previous.tag.eq(self.i.payload.tag)]
                if self.layers > 1:
                    m.d.sync += previous.layer.eq(self.i.payload.layer)
        for group in groups:
            trials = [previous.rem] + [previous.rem - (previous.multiples[c - 1] << group[-1])
                                       for c in range(1, 1 << len(group))]
            previous = digit_stage(group, trials, previous, [previous.multiples[c - 1] for c in digits])
        m.d.comb += [
            out.i.valid.eq(previous.valid),
            out.i.payload.value.eq(previous.quotient + self.plan.offset if self.plan.rules is None else previous.value),
            out.i.payload.tag.eq(previous.tag),
        ]
        return m
