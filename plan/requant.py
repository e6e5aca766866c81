"""The requant and floor-divider units' plans: their rules, and every width that follows from them."""

from dataclasses import dataclass

from int8model.bounds import Bound

from .arithmetic import LoadedRule, ResultTable, Rule, multiplier_bits, product_multipliers

__all__ = ["RequantPlan", "requant_plan", "DividerPlan", "divider_plan", "union"]


def union(*bounds):
    return Bound(min(b.lo for b in bounds), max(b.hi for b in bounds))


@dataclass(frozen=True)
class RequantPlan:
    """A requant unit (:class:`hdl.requant.Requant`): its rules, the range of the values each
    rule takes (and of what it adds after the shift), and the widths and timing they decide.

    ``tables[i]``: rule ``i``'s results go through a :class:`~.arithmetic.ResultTable` in the
    same last stage. ``registered_input``: the producer's registers are the first stage.
    ``multiplier_input``: each input carries its rule's multiplier. ``sum_stage``: the
    product's terms are added in a stage of their own. ``loaded``: every rule is a
    :class:`~.arithmetic.LoadedRule`, each input carrying its multiplier and shift; the shift
    takes a stage of its own and the addend is added after it.
    """
    rules: tuple
    rule_bounds: tuple
    addend_bounds: tuple | None
    tables: tuple
    registered_input: bool
    multiplier_input: bool
    sum_stage: bool
    in_bound: Bound
    in_bits: int
    product_bits: int
    out_bound: Bound
    out_bits: int
    multiplier_bits: int
    addend_bits: int
    shift_only: bool
    latency: int
    multipliers: int
    loaded: bool = False

    SHIFT_BITS = 6  # a loaded rule's shift, 0..63


def requant_plan(in_bound, rules, *, registered_input=False, addend_bounds=None, multiplier_input=False,
                 sum_stage=False, followed_by=None):
    """The :class:`RequantPlan` of ``rules`` for inputs in ``in_bound`` (one bound, or one per
    rule), each rule's inputs adding a value in ``addend_bounds[i]`` (``None``: it adds none)
    after the shift, and followed by ``followed_by[i]`` (a rule applied by a table of results)."""
    rules = tuple(rules)
    if not rules:
        raise ValueError("a requant unit needs at least one rule")
    loaded = any(isinstance(rule, LoadedRule) for rule in rules)
    if loaded and not (all(isinstance(rule, LoadedRule) for rule in rules) and multiplier_input and not any(followed_by or ())):
        raise ValueError("loaded rules come all together, with their multipliers on the input, and no table")
    for rule in rules:
        if not loaded and not 0 <= rule.shift <= 63:
            raise ValueError(f"shift {rule.shift} is outside 0..63")
    rule_bounds = tuple(in_bound) if isinstance(in_bound, (list, tuple)) else (in_bound,) * len(rules)
    if len(rule_bounds) != len(rules):
        raise ValueError(f"{len(rule_bounds)} input bounds for {len(rules)} rules")
    if addend_bounds is not None:
        addend_bounds = tuple(addend_bounds)
        if len(addend_bounds) != len(rules):
            raise ValueError(f"{len(addend_bounds)} addend bounds for {len(rules)} rules")
    addends = addend_bounds or (None,) * len(rules)
    results = [rule.result_bound(b, a) for rule, b, a in zip(rules, rule_bounds, addends)]
    tables = [None] * len(rules)
    for index, then in enumerate(followed_by or []):
        if then is None:
            continue
        if rules[index].saturate:
            raise ValueError(f"rule {index} saturates: no table can follow it")
        entries = ResultTable.size(results[index], then)
        if entries > ResultTable.LIMIT:
            raise ValueError(f"rule {index}'s table would take {entries} entries, more than {ResultTable.LIMIT}")
        tables[index] = ResultTable.of(results[index], then)
        results[index] = tables[index].out_bound
    whole = union(*rule_bounds)
    bits = multiplier_bits(rules)
    shift_only = not loaded and all(r.multiplier >= 0 and r.multiplier & (r.multiplier - 1) == 0 for r in rules)
    out = union(*results)
    return RequantPlan(
        rules=rules, rule_bounds=rule_bounds, addend_bounds=addend_bounds, tables=tuple(tables),
        registered_input=registered_input, multiplier_input=multiplier_input, sum_stage=sum_stage,
        in_bound=whole, in_bits=whole.bits,
        product_bits=max(rule.sum_bound(b, a).bits for rule, b, a in zip(rules, rule_bounds, addends)),
        out_bound=out, out_bits=out.bits, multiplier_bits=bits,
        addend_bits=max((a or Bound(0, 0)).bits for a in addends) if addend_bounds is not None else 0,
        shift_only=shift_only,
        # Stage 1 registers the input (unless the producer's registers are it), stage 2 the
        # product (none where every multiplier is a power of two), then the sum (with
        # sum_stage), the loaded shift, and the result.
        latency=(not registered_input) + (not shift_only) + sum_stage + loaded + 1,
        multipliers=0 if shift_only else product_multipliers(whole.bits, True, bits, True), loaded=loaded)


@dataclass(frozen=True)
class DividerPlan:
    """A floor divider (:class:`hdl.divider.FloorDivider`) for numerators, denominators and
    quotients in their bounds: the numerator offset by ``offset · den`` (``offset`` the power
    of two, or 0, at or below the quotient's low end) is divided by restoring division, ``steps``
    quotient bits, ``bits_per_stage`` a pipeline stage; ``rules`` (if any, one per layer of a
    deep model, the division's layer choosing) applied to the quotient in the last stage."""
    num_bound: Bound
    den_bound: Bound
    quotient_bound: Bound
    bits_per_stage: int
    rules: tuple | None
    offset: int
    steps: int
    rem_bits: int
    value_bound: Bound
    first_trials: tuple
    fused: bool
    latency: int


def divider_plan(num_bound, den_bound, quotient_bound, *, bits_per_stage=2, rule=None, rules=None):
    """``rule``: one rule for every division; ``rules``: one per layer."""
    if den_bound.lo <= 0:
        raise ValueError(f"the denominator must be positive, not as low as {den_bound.lo}")
    offset = 0 if quotient_bound.lo >= 0 else -(1 << (-quotient_bound.lo - 1).bit_length())
    steps = max(1, (quotient_bound.hi - offset).bit_length())
    # The first digit's trials are num + k · den (offset and digit together): where each k is
    # 0 or ± a power of two, each is the numerator plus one shift, and the offset costs no stage.
    first = list(reversed(range(steps)))[:bits_per_stage]
    first_trials = tuple(-offset - (c << first[-1]) for c in range(1 << len(first)))
    fused = all(bin(k).count("1") <= 1 for k in first_trials)
    if rule is not None:
        rules = (rule,)
    rules = None if rules is None else tuple(rules)
    return DividerPlan(
        num_bound=num_bound, den_bound=den_bound, quotient_bound=quotient_bound, bits_per_stage=bits_per_stage,
        rules=rules, offset=offset, steps=steps,
        # The offset numerator, always below 2**steps · den.
        rem_bits=Bound(0, (1 << steps) * den_bound.hi).bits,
        value_bound=quotient_bound if rules is None else union(*(r.result_bound(quotient_bound) for r in rules)),
        first_trials=first_trials, fused=fused, latency=-(-steps // bits_per_stage) + (not fused))
