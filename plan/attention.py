"""The attention unit's plan: the softmax's widths, its exponential table as read, and the
context's divider."""

from dataclasses import dataclass

from int8model.bounds import Bound

from .arithmetic import LoadedRule, Rule, constant_product_terms, multiplier_bits, product_multipliers, product_terms, \
    saturating_gap
from .requant import DividerPlan, divider_plan, union
from .units import CachePlan

__all__ = ["AttentionPlan", "attention_plan", "loaded_attention_plan", "score_sum_stages", "exp_entries"]


@dataclass(frozen=True)
class AttentionPlan:
    """LUT-softmax attention (:class:`hdl.attention.Attention`) over a cache of ``seq_len`` rows,
    ``rows`` a cycle (``groups`` groups of rows), ``ways`` context columns a cycle, for each of
    ``layers`` layers (its own ``M_score`` and ``r_ctx`` in ``score_rules`` and ``ctx_rules``).

    The gap from a head's maximum score is clamped to ``gap_operand_bits`` (where no layer's
    LUT index changes any more), times ``M_score`` in ``product_stages`` cycles, then shifted in
    ``index_stages`` (the shifted index registered where its shift is not one constant); the exp
    table is
    read as ``exp_depth`` entries (spread: its last entry repeated to every index a clamped gap
    gives, so that no clamp lies between the product and the table). ``ctx_requant``: some
    layer's ``r_ctx`` changes the context, and the divider applies it. ``loaded``: a loadable
    build's, its rules from registers, the exp table and each layer's table of ``r_ctx``'s
    results (:attr:`ctx_table_depth`) written by the load. ``sum_stages``: registers from a
    score's products to its head's sum (:func:`score_sum_stages`)."""
    d_model: int
    n_heads: int
    seq_len: int
    ways: int
    rows: int
    score_rules: tuple
    ctx_rules: tuple
    ctx_requant: bool
    q_bound: Bound
    score_bound: Bound
    gap_bound: Bound
    scaled_bound: Bound
    weight_bound: Bound
    den_bound: Bound
    num_bound: Bound
    ctx_bound: Bound
    gap_operand_bits: int
    product_stages: int
    exp_spread: bool
    exp_depth: int
    nlut: int
    divider: DividerPlan
    index_stages: int = 0
    loaded: bool = False
    sum_stages: int = 2

    SCORES_IN_LUTS = 32  # groups: the deepest score memories kept in LUT RAM
    # Entries up to which the exp table is a ROM in logic (a few LUT4s a bit); deeper, a block RAM.
    EXP_TABLE_IN_LOGIC = 256
    # The most entries the exp table is spread over (a DP16KD's depth at 16 bits), past its own:
    # an extreme M_score maps the few clamped gaps onto millions of indices.
    SPREAD_ENTRIES = 1024
    # From this many multipliers on, a head's pair sums come from across the part: their route
    # into the head's sum limited the deep demo's clock (docs/timing.md), and a stage of sums of
    # four between them splits it, for a cycle more a score pass.
    SPREAD_MULTIPLIERS = 128

    @property
    def spread(self):
        """Attention's multipliers spread over the part (:func:`spreads`): its sums and the
        selects that reach all of them take a register more."""
        return spreads(self.d_model, self.rows)

    @property
    def gap_stages(self):
        """Cycles from the clamped gap to the exp table's index."""
        return self.product_stages + self.index_stages

    @property
    def layers(self):
        return len(self.score_rules)

    @property
    def score_rule(self):
        """A one-layer model's ``M_score``."""
        return self.score_rules[0]

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    @property
    def groups(self):
        return -(-self.seq_len // self.rows)

    @property
    def score_bits(self):
        return self.score_bound.bits

    @property
    def gap_bits(self):
        return self.gap_bound.bits

    @property
    def weight_bits(self):
        return self.weight_bound.bits

    @property
    def operand_bits(self):
        """The width of a multiplier's first operand: q in the score phase, a weight in the next."""
        return max(8, self.weight_bits)

    @property
    def ctx_bits(self):
        return self.divider.value_bound.bits

    @property
    def shallow_scores(self):
        return self.groups <= self.SCORES_IN_LUTS

    @property
    def score_read_stages(self):
        """Registers between a score's read and the gap's subtraction: a block RAM's slow output
        is held first (the deep demo's critical path began there, docs/timing.md)."""
        return 0 if self.shallow_scores else 1

    @property
    def exp_style(self):
        if self.loaded:  # written by the load: a RAM
            return "distributed" if self.exp_depth <= self.EXP_TABLE_IN_LOGIC else "block"
        return "logic" if self.exp_depth <= self.EXP_TABLE_IN_LOGIC else "block"

    @property
    def cache(self):
        """The cache it reads: a bank for each row of a group."""
        return CachePlan(self.d_model, self.seq_len, self.rows, self.layers)

    @property
    def score_multiplier_bits(self):
        """The width of a layer's ``M_score``, where the layers choose it."""
        return multiplier_bits(self.score_rules)

    @property
    def score_scale_terms(self):
        """The terms of a clamped gap times ``M_score``: a constant's for one layer, else a
        signal's (the layer's multiplier)."""
        if self.layers == 1 and not self.loaded:
            return constant_product_terms(self.gap_operand_bits, False, self.score_rule.multiplier)
        return product_terms(self.gap_operand_bits, False, self.score_multiplier_bits, True)

    CTX_ENTRIES = 256  # a loadable build's table of r_ctx's results: one per int8 quotient

    @property
    def ctx_table_depth(self):
        return self.layers * self.CTX_ENTRIES

    @property
    def multipliers(self):
        """DSP blocks: the first bank's products (the others' are LUT logic), a score scale
        per head and bank."""
        products = self.d_model * product_multipliers(self.operand_bits, True, 8, True)
        scales = self.n_heads * self.rows * sum(term.multipliers for term in self.score_scale_terms)
        return products + scales


def attention_plan(model, bounds, *, ways=1, rows=1):
    """The :class:`AttentionPlan` of ``model`` for its ``bounds`` (:func:`int8model.bounds.analyse`)."""
    layers = bounds.layers
    score_rules = tuple(Rule.rq(layer.requant["M_score"]) for layer in model.layers)
    ctx_rules = tuple(Rule.to8(layer.requant["r_ctx"]) for layer in model.layers)
    nlut = len(model.exp_lut)
    gap = union(*(b["score_gap"] for b in layers))
    ctx = union(*(b["ctx"] for b in layers))
    # The gaps are clamped where no layer's LUT index changes any more: the M_score product is
    # then narrower. Any clamp at or above that point reads the same entries: the next
    # all-ones value is judged on the gap's high bits alone, with no comparison after the
    # subtraction.
    gap_operand_bits = max(1, *(saturating_gap(rule, nlut, b["score_gap"].hi).bit_length()
                                for rule, b in zip(score_rules, layers)))
    # The largest clamped gap's index, of every layer: the table is spread to it where that
    # takes few entries (its entries do not depend on the layer).
    tops = [((1 << gap_operand_bits) - 1) * rule.multiplier >> rule.shift for rule in score_rules]
    exp_spread = all(rule.multiplier > 0 for rule in score_rules) and max(tops) < max(nlut, AttentionPlan.SPREAD_ENTRIES)
    if len(score_rules) == 1:
        terms = constant_product_terms(gap_operand_bits, False, score_rules[0].multiplier)
    else:
        terms = product_terms(gap_operand_bits, False, multiplier_bits(score_rules), True)
    # Where r_ctx changes no context (a trained model's (1, 0)), the quotients leave as they are.
    ctx_requant = any(not rule.is_identity_on(b["ctx"]) for rule, b in zip(ctx_rules, layers))
    scaled = union(*(b["score_gap*M_score"] for b in layers))
    if len(score_rules) > 1:  # the clamped gap of any layer, times any layer's multiplier
        widest = Bound(0, (1 << gap_operand_bits) - 1)
        scaled = union(scaled, *(widest.times(rule.multiplier) for rule in score_rules))
    return AttentionPlan(
        d_model=model.d_model, n_heads=model.n_heads, seq_len=model.seq_len, ways=ways, rows=rows,
        score_rules=score_rules, ctx_rules=ctx_rules, ctx_requant=ctx_requant,
        q_bound=union(*(b["q"] for b in layers)), score_bound=union(*(b["scores"] for b in layers)), gap_bound=gap,
        scaled_bound=scaled, weight_bound=layers[0]["weights"], den_bound=layers[0]["den"],
        num_bound=union(*(b["num"] for b in layers)), ctx_bound=ctx, gap_operand_bits=gap_operand_bits,
        # A deep model's shift is its layer's, selected: the shifted index is registered, its
        # clamp judged beside the select, so that only a select is left before the table's read.
        product_stages=1 if len(terms) <= 1 else 2, index_stages=1 if len(score_rules) > 1 else 0,
        exp_spread=exp_spread, sum_stages=score_sum_stages(model.d_model, rows),
        exp_depth=max(tops) + 1 if exp_spread else nlut, nlut=nlut,
        divider=divider_plan(union(*(b["num"] for b in layers)), layers[0]["den"], ctx,
                             rules=ctx_rules if ctx_requant else None))


def loaded_attention_plan(limits, bounds, *, ways=1, rows=1):
    """A loadable build's :class:`AttentionPlan` for the ``bounds`` of its ``limits``
    (:func:`~.limits.envelope`): ``M_score`` from registers times the whole gap, its shift a
    shifter; the exp table a power of two of entries (a model's shorter table padded with its
    last entry, which is what the clamp to ``nlut − 1`` reads), so that the clamp is logic on
    the index's bits; ``r_ctx`` by a table of its results, after the divider."""
    layers = bounds.layers
    score_rules = tuple(LoadedRule(limits.multiplier_bits, saturate=False) for _ in layers)
    gap = union(*(b["score_gap"] for b in layers))
    gap_operand_bits = max(1, gap.hi.bit_length())
    terms = product_terms(gap_operand_bits, False, limits.multiplier_bits, True)
    depth = 1 << (limits.max_nlut - 1).bit_length()
    ctx = union(*(b["ctx"] for b in layers))
    return AttentionPlan(
        d_model=limits.d_model, n_heads=limits.n_heads, seq_len=limits.seq_len, ways=ways, rows=rows,
        score_rules=score_rules, ctx_rules=tuple(LoadedRule(limits.multiplier_bits) for _ in layers),
        ctx_requant=False, q_bound=union(*(b["q"] for b in layers)),
        score_bound=union(*(b["scores"] for b in layers)), gap_bound=gap,
        scaled_bound=Bound(0, (1 << gap_operand_bits) - 1) * Bound.signed(limits.multiplier_bits),
        weight_bound=layers[0]["weights"], den_bound=layers[0]["den"], num_bound=union(*(b["num"] for b in layers)),
        # Two stages for the shift, which is not a constant: the product held before it, the
        # shifted index after it.
        ctx_bound=ctx, gap_operand_bits=gap_operand_bits, product_stages=1 if len(terms) <= 1 else 2,
        index_stages=2, exp_spread=False, exp_depth=depth, nlut=depth, sum_stages=score_sum_stages(limits.d_model, rows),
        divider=divider_plan(union(*(b["num"] for b in layers)), layers[0]["den"], ctx), loaded=True)


def spreads(d_model, rows):
    """Whether attention's ``d_model`` multipliers a row of ``rows`` spread over the part."""
    return d_model * rows >= AttentionPlan.SPREAD_MULTIPLIERS


def score_sum_stages(d_model, rows):
    """Registers from a score's products to its head's sum, for ``d_model`` multipliers a row of
    ``rows``: their pair sums, then the head's; where they spread over the part, sums of four
    pair sums between."""
    return 3 if spreads(d_model, rows) else 2


def exp_entries(plan, exp_lut):
    """The exp table as attention reads it: spread, or as it stands."""
    lut = [int(v) for v in exp_lut]
    if plan.loaded:  # padded with its last entry, which every index from its end on reads
        return [lut[min(i, len(lut) - 1)] for i in range(plan.exp_depth)]
    if plan.exp_spread:
        return [lut[min(i, plan.nlut - 1)] for i in range(plan.exp_depth)]
    return lut
