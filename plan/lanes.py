"""The MAC lanes' plan: which matrices, in which order, how they are laid out in the weight
memory, and the accumulator's width."""

from dataclasses import dataclass

import numpy as np

from int8model.bounds import Bound, matvec_bound

from .arithmetic import constant_requant_latency, product_multipliers

__all__ = ["INT8", "MatrixPlan", "HiddenPlan", "LanesPlan", "lanes_plan", "weight_table", "bank_words"]

INT8 = Bound(-128, 127)


@dataclass(frozen=True)
class MatrixPlan:
    """A matrix of ``rows`` × ``cols`` in the lanes: ``groups`` groups of columns, each taking
    ``steps`` input words (for the second of a hidden pair, ``steps`` output words), its first
    word at ``base`` of the weight memory; its inputs in ``input_bound``, its sums in
    ``acc_bound``."""
    rows: int
    cols: int
    steps: int
    groups: int
    base: int
    input_bound: Bound
    acc_bound: Bound


@dataclass(frozen=True)
class HiddenPlan:
    """Two matrices in a chain inside the lanes, ``second · rules(first · x)``: the first's sums
    (in ``bound``) through the rules in logic, then the second takes them as they stand.
    ``lead``: idle cycles between the first's last word and the second's first;
    ``column_stages``: registers of a column's sum across the lanes; ``latency``: from the
    first's last input word to the second's first output word."""
    first: int
    second: int
    rules: tuple
    bound: Bound
    lead: int
    column_stages: int
    latency: int


@dataclass(frozen=True)
class LanesPlan:
    """The MAC lanes (:class:`hdl.matvec.MatVec`): ``lanes`` lanes of ``ways`` multipliers (the
    last ``lut_ways`` of them in LUT logic) over ``matrices``, which usually come in ``order``;
    the ``whole`` one's sums leave a group at a time; ``hidden`` a chained pair. The weight
    memory holds ``depth`` words in banks of lanes (``banks``, each a range)."""
    lanes: int
    ways: int
    lut_ways: int
    matrices: tuple
    order: tuple
    whole: int | None
    hidden: HiddenPlan | None
    depth: int
    acc_bound: Bound
    acc_bits: int
    banks: tuple

    BANK_LANES = 8     # lanes per bank of the weight memory, each with its own address register
    COLUMN_FAN_IN = 4  # terms added into one register of a column's sum across the lanes (hidden)

    @property
    def multipliers(self):
        """DSP blocks: each lane's ways but those in LUTs, an int8 by int8 product each."""
        return self.lanes * (self.ways - self.lut_ways) * product_multipliers(8, True, 8, True)

    @property
    def rows(self):
        return [matrix.rows for matrix in self.matrices]

    @property
    def cols(self):
        return [matrix.cols for matrix in self.matrices]

    @property
    def steps(self):
        return [matrix.steps for matrix in self.matrices]

    @property
    def groups(self):
        return [matrix.groups for matrix in self.matrices]

    @property
    def bases(self):
        return [matrix.base for matrix in self.matrices] + [self.depth]

    def bank_width(self, bank):
        return 8 * self.ways * len(range(*self.banks[bank]))


def _rounds(terms, fan_in):
    """Rounds of adding ``fan_in`` terms at a time into registers, until one is left (at least one)."""
    rounds = 0
    while terms > 1:
        terms, rounds = -(-terms // fan_in), rounds + 1
    return max(1, rounds)


def lanes_plan(matrices, lanes, *, ways=1, lut_ways=0, input_bounds=None, order=None, whole=None, hidden=None):
    """The :class:`LanesPlan` for ``matrices`` (2-D int8 arrays, rows × cols, input-major), each
    one's inputs in ``input_bounds`` (int8 by default). ``hidden``: ``(first, second, rules,
    bound)``, two indices whose product chains through ``rules`` on sums in ``bound``."""
    matrices = [np.asarray(w, dtype=np.int64) for w in matrices]
    if not matrices:
        raise ValueError("the lanes need at least one matrix")
    for w in matrices:
        if w.ndim != 2 or w.size == 0 or w.min() < -128 or w.max() > 127:
            raise ValueError("every matrix is a non-empty 2-D int8 array")
    if ways < 1 or lanes < 1 or lanes % ways:
        raise ValueError(f"{lanes} lanes and {ways} ways: the lanes must be a multiple of the ways")
    if not 0 <= lut_ways <= ways:
        raise ValueError(f"{lut_ways} of {ways} ways in LUTs: it takes 0 to {ways}")
    n = len(matrices)
    order = tuple(range(n)) if order is None else tuple(int(index) for index in order)
    if not order or len(set(order)) != len(order) or not all(0 <= index < n for index in order):
        raise ValueError(f"order {list(order)}: distinct indices of the {n} matrices")
    if whole is not None and not 0 <= whole < n:
        raise ValueError(f"whole {whole}: an index of the {n} matrices")
    rows = [w.shape[0] for w in matrices]
    cols = [w.shape[1] for w in matrices]
    steps = [-(-r // ways) for r in rows]
    groups = [-(-c // lanes) for c in cols]
    hidden_plan = None
    if hidden is not None:
        first, second, rules, bound = hidden
        if not (0 <= first < n and 0 <= second < n and first != second and whole not in (first, second)):
            raise ValueError(f"hidden {first}, {second}: two indices of the {n} matrices, neither the whole one")
        if cols[first] > lanes or rows[second] > lanes or cols[first] != rows[second]:
            raise ValueError(f"hidden: the first's {cols[first]} columns are the second's {rows[second]} rows, "
                             f"and fit the {lanes} lanes")
        if first not in order or order[(order.index(first) + 1) % len(order)] != second:
            raise ValueError(f"hidden: matrix {second} follows matrix {first} in order {list(order)}")
        if not rules:
            raise ValueError("hidden: at least one rule")
        steps[second], groups[second] = -(-cols[second] // ways), 1
        # The first's last word reaches the hidden sums 5 cycles after its issue, the rules
        # take their stages, and the second's first word meets the vector at the operands
        # 2 cycles after its issue: so many idle cycles between the two.
        lead = 2 + constant_requant_latency(rules)
        # A column's terms: a DSP product a lane, or a LUT product's two halves.
        column_stages = _rounds(lanes * (2 if lut_ways else 1), LanesPlan.COLUMN_FAN_IN)
        hidden_plan = HiddenPlan(first, second, tuple(rules), bound, lead, column_stages, lead + 5 + column_stages)
    bases = np.cumsum([0] + [s * g for s, g in zip(steps, groups)]).tolist()
    input_bounds = list(input_bounds) if input_bounds is not None else [INT8] * n
    sums = [matvec_bound(b, w) for b, w in zip(input_bounds, matrices)]
    plans = tuple(MatrixPlan(r, c, s, g, base, b, acc)
                  for r, c, s, g, base, b, acc in zip(rows, cols, steps, groups, bases, input_bounds, sums))
    acc = Bound(min(b.lo for b in sums), max(b.hi for b in sums))
    banks = tuple((first, min(first + LanesPlan.BANK_LANES, lanes)) for first in range(0, lanes, LanesPlan.BANK_LANES))
    return LanesPlan(lanes, ways, lut_ways, plans, order, whole, hidden_plan, bases[-1], acc, acc.bits, banks)


def weight_table(plan, matrices):
    """The weight memory's contents: ``[word, k, lane]``, one word per (matrix, group, step),
    lane l's weight for the step's element k (zero past the matrix); for the second of a
    hidden pair, one word per output word, lane l's weight of row l for the word's column k."""
    table = np.zeros((plan.depth, plan.ways, plan.lanes), dtype=np.int64)
    word = 0
    for index, (w, matrix) in enumerate(zip(matrices, plan.matrices)):
        w = np.asarray(w, dtype=np.int64)
        if plan.hidden is not None and index == plan.hidden.second:
            w = w.T  # rows become lanes, columns elements
        for g in range(matrix.groups):
            for step in range(matrix.steps):
                block = w[step * plan.ways:(step + 1) * plan.ways, g * plan.lanes:(g + 1) * plan.lanes]
                table[word, :block.shape[0], :block.shape[1]] = block
                word += 1
    return table


def bank_words(plan, table, bank):
    """Bank ``bank``'s words of the weight ``table`` as integers: lane l's weight for element k
    in byte ``k · (the bank's lanes) + l``."""
    start, stop = plan.banks[bank]
    words = table[:, :, start:stop].reshape(plan.depth, -1)
    return [sum((int(byte) & 0xff) << (8 * at) for at, byte in enumerate(word)) for word in words]
