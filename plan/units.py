"""The plans of the smaller units: the epilogue and its residual stream, the embedding, the
source of q, k and v, the KV cache and the arg-max."""

from dataclasses import dataclass

from int8model.bounds import Bound

from .arithmetic import LoadedRule, Rule, multiplier_bits
from .requant import RequantPlan, requant_plan, union
from .schedule import Stage

__all__ = ["ResidualPlan", "EpiloguePlan", "epilogue_plan", "EmbeddingPlan", "QKVPlan", "CachePlan",
           "ArgMaxPlan", "argmax_plan"]


@dataclass(frozen=True)
class ResidualPlan:
    """The residual stream's stored vectors (name and range), and per stage the vector it adds
    and the one it stores (``None`` for none); ``columns`` entries each, the stored values
    ``value_bits`` wide as they arrive."""
    vectors: tuple
    rules: tuple
    columns: int
    value_bits: int

    @property
    def addend_bits(self):
        return max(bound.bits for _, bound in self.vectors)


@dataclass(frozen=True)
class EpiloguePlan:
    """An epilogue (:class:`hdl.epilogue.Epilogue`): the first requant (a rule per stage, adding
    the residual's entry), the residual stream, the last requant to int8 (a rule per stage).
    ``early``: the stages that leave after the first requant. ``scratch``: a column past every
    vector, where a value that only fills a word goes."""
    first: RequantPlan
    residual: ResidualPlan
    last: RequantPlan
    early: tuple
    scratch: int
    columns: int
    carried_multiplier_bits: int

    @property
    def selects(self):
        """The rules of each requant: one per stage of each layer (``StagePlan.select``)."""
        return len(self.first.rules)

    @property
    def multipliers(self):
        return self.first.multipliers + self.last.multipliers

    def latency(self, select):
        """Cycles from a value of stage ``select`` in to its int8 out: EMBED skips the first
        requant, the early stages the last."""
        if select == Stage.EMBED:
            return self.last.latency
        return self.first.latency + (0 if select in self.early else self.last.latency)


def epilogue_plan(stages, bounds, d_model, d_ff):
    """The epilogue of a step's :func:`~.schedule.stage_plans` (every layer's stages, in the
    order of their ``select``), for the model's ``bounds``: the residual's vectors hold each
    layer's x and s1 in turn, as wide as the widest of them."""
    # A stage that skips a requant has a rule there all the same (the rules are indexed by
    # stage): one that makes 0, so that it widens neither the unit's output nor what follows.
    unused = Rule(0, 0, saturate=False)
    loaded = isinstance(stages[0].last, LoadedRule)
    if loaded:  # the load writes it: multiplier 0
        unused = LoadedRule(stages[0].last.multiplier_bits, saturate=False, result=Bound(0, 0))
    layers = bounds.layers
    stored = {"x": union(*(b["x"] for b in layers)), "s1": union(*(b["s1"] for b in layers))}
    scratch = max(d_model, d_ff)
    first = requant_plan(
        [s.in_bound for s in stages], [s.first or unused for s in stages],
        registered_input=True, multiplier_input=True, sum_stage=True,
        addend_bounds=[stored[s.adds] if s.adds else None for s in stages],
        followed_by=[s.then for s in stages])
    middle = union(*(b[name] for b in layers for name in ("x", "s1", "s2", "relu", "q", "k", "v")), first.out_bound)
    last_rules = [s.last or unused for s in stages]
    residual = ResidualPlan(tuple(stored.items()), tuple((s.adds, s.stores) for s in stages), scratch + 1,
                            middle.bits)
    return EpiloguePlan(
        # A loaded rule's product is summed in a stage of its own, before its shifter.
        first=first, residual=residual, last=requant_plan(middle, last_rules, multiplier_input=True, sum_stage=loaded),
        early=tuple(s.select for s in stages if s.last is None and s.first is not None),
        scratch=scratch, columns=scratch + 1, carried_multiplier_bits=multiplier_bits(last_rules))


@dataclass(frozen=True)
class EmbeddingPlan:
    """The embedding's two ROMs, ``x = EinA[tok] + PinA[pos]`` a word of ``ways`` columns a
    cycle: each row takes ``row_words`` words (a power of two, so that a row's address is a
    shift), the token table's entries ``token_bits`` wide, the position table's
    ``position_bits``."""
    d_model: int
    vocab: int
    seq_len: int
    ways: int
    words: int
    row_words: int
    token_bits: int
    position_bits: int
    x_bound: Bound

    @property
    def token_depth(self):
        return self.vocab * self.row_words

    @property
    def position_depth(self):
        return self.seq_len * self.row_words


@dataclass(frozen=True)
class QKVPlan:
    """Where q, K[pos] and V[pos] come from: ``"table"`` (a row of every token and position,
    ``table_depth`` rows of ``3 · d_model`` int8, addressed by the token above ``pos_bits`` of
    position), or ``"computed"`` by the QKV product, whose input xi comes from a table of
    every token and position where ``xi_table`` (``xi_depth`` words: token, position, word)."""
    source: str
    pos_bits: int
    word_bits: int
    table_depth: int
    xi_table: bool
    xi_depth: int

    @property
    def table(self):
        return self.source == "table"


@dataclass(frozen=True)
class CachePlan:
    """The KV cache: for each of ``layers`` layers, ``seq_len`` rows of ``d_model`` int8, K and
    V, over ``banks`` memories (position ``p`` in bank ``p mod banks``); a deep model's layers
    one above the other in each memory, a power of two of rows apart (``group_bits``), so that
    an address is the layer's and the group's bits side by side."""
    d_model: int
    seq_len: int
    banks: int
    layers: int = 1

    @property
    def groups(self):
        """Rows a layer takes in each bank."""
        return -(-self.seq_len // self.banks)

    @property
    def group_bits(self):
        return (self.groups - 1).bit_length()

    @property
    def depth(self):
        return self.groups if self.layers == 1 else self.layers << self.group_bits

    @property
    def row_bits(self):
        return 8 * self.d_model


@dataclass(frozen=True)
class ArgMaxPlan:
    """The arg-max (:class:`hdl.argmax.ArgMax`) of runs of up to ``length`` signed values of
    ``value_bits``, ``ways`` at once: a tournament of ``levels`` contests, ``stages`` pipeline
    stages; ``single`` where a run is one word."""
    value_bits: int
    length: int
    ways: int
    levels: int
    stages: int
    single: bool
    latency: int

    # Contests in series between registers, each a comparison and a select.
    LEVELS_PER_STAGE = 1


def argmax_plan(value_bits, length, ways=1):
    levels = (ways - 1).bit_length()
    stages = max(1, -(-levels // ArgMaxPlan.LEVELS_PER_STAGE))
    single = length <= ways
    return ArgMaxPlan(value_bits, length, ways, levels, stages, single, stages + (not single))
