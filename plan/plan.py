"""A model and a part become one plan: every decision the hardware is built from.

:func:`make_plan` decides, for a model and a :class:`~.shape.Shape`, each unit's parameters
and widths (from the model's own bounds), the step's stages, the memories (which holds what,
how deep, how wide, in which kind of RAM) and the multipliers, and refuses with
:class:`FitError` a part that has too few; :func:`choose_plan` picks the shape a part fits
best. Nothing here imports Amaranth: the hardware, the build, the cycle counter and the
benchmarks all read the same plan.
"""

import dataclasses
import enum
from dataclasses import dataclass

import numpy as np

from int8model.bounds import Bound, ModelBounds, analyse
from wire import MAX_PAYLOAD, Ident

from .arithmetic import ResultTable
from .attention import AttentionPlan, attention_plan, loaded_attention_plan
from .limits import Limits, envelope
from .loading import BOOT_BLOCK, RULE_MULTIPLIER_BITS, load_frame_bytes
from .lanes import LanesPlan, lanes_plan
from .parts import BLOCK_BITS, PARTS, Part, blocks_for
from .schedule import LAYER_MATRICES, MATRICES, Matrix, head_index, hidden_rules, product_matrices, stage_plans
from .shape import (ATTENTION_ROWS, MAX_WAYS, Shape, lanes_for, qkv_table_depth, xi_table_depth,
                    xi_table_fits)
from .units import ArgMaxPlan, CachePlan, EmbeddingPlan, EpiloguePlan, QKVPlan, argmax_plan, epilogue_plan

__all__ = ["FitError", "ModelSummary", "MemoryPlan", "Plan", "make_plan", "make_loadable_plan", "choose_plan",
           "candidate_shapes", "REGISTERED_FEED_LANES"]

# From this many lanes on, the epilogues' words and attention's context reach the lanes' input
# through registers of their own: so wide a lane array spreads its issue logic over the part,
# and the routes from an epilogue's output (through the decode of where its word goes) and from
# the context's queue into the lanes' input limited the deep demo's clock (docs/timing.md). A
# cycle more for each product they feed. The lanes' input queue's head leaves from a register
# too (read ahead: no cycle more), so that their issue does not start with its LUT RAM's read.
REGISTERED_FEED_LANES = 64


class FitError(ValueError):
    """A model that does not fit the part, in the shape asked: what it needs against what the part has."""


@dataclass(frozen=True)
class ModelSummary:
    """What the plan knows of the model beyond its bounds: its identity and sizes."""
    sha256: str
    d_model: int
    n_heads: int
    d_ff: int
    vocab: int
    seq_len: int
    nlut: int
    n_layers: int = 1

    @property
    def head_dim(self):
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class MemoryPlan:
    """One memory of the design: its place in the device's hierarchy (``path``, as the hardware
    names its submodules), what it holds, ``depth`` words of ``width`` bits, its kind of RAM
    (``"block"``, ``"distributed"``: LUT RAM, or ``"logic"``: a ROM of LUTs) and the block RAMs
    it takes."""
    path: str
    holds: str
    depth: int
    width: int
    style: str

    @property
    def blocks(self):
        return blocks_for(self.depth, self.width) if self.style == "block" else 0

    @property
    def bits(self):
        return self.depth * self.width


@dataclass(frozen=True)
class Plan:
    """Every decision that turns a model into hardware (see the module's docstring)."""
    model: ModelSummary
    part: Part | None
    shape: Shape
    stages: tuple
    embedding: EmbeddingPlan
    qkv: QKVPlan
    lanes: LanesPlan
    feed_depth: int
    epilogue: EpiloguePlan
    attention: AttentionPlan
    cache: CachePlan
    argmax: ArgMaxPlan
    memories: tuple
    limits: Limits | None = None
    boot_depth: int = 0
    feed_registered: bool = False


    @property
    def loadable(self):
        """A build for a shape, its model loaded at run time within ``limits`` (docs/loading.md)."""
        return self.limits is not None

    @property
    def boot(self):
        """Whether a loadable build holds a boot image (``boot_depth`` bytes): frames replayed at
        power-up, which ``hdl.build --from`` rewrites to hold a model's load."""
        return self.boot_depth > 0

    # -- The step's data flow, from the schedule.

    def stage(self, stage, layer=0):
        return self.stages[layer][stage]

    @property
    def all_stages(self):
        """Every layer's stages, in the order of their ``select`` (the epilogue's rules)."""
        return [stage for layer in self.stages for stage in layer]

    @property
    def order(self):
        """The lanes' products a step runs, in order (the first layer's QKV only where its q,
        k and v are computed)."""
        return [index for index in range(len(self.lanes.matrices)) if index != Matrix.QKV or not self.qkv.table]

    # -- Resources.

    @property
    def multipliers(self):
        """DSP blocks by unit: the MAC lanes, attention, the epilogues' requants."""
        return {"MAC lanes": self.lanes.multipliers, "attention": self.attention.multipliers,
                "epilogues": self.shape.ways * self.epilogue.multipliers}

    @property
    def dsp_blocks(self):
        return sum(self.multipliers.values())

    @property
    def block_rams(self):
        return sum(memory.blocks for memory in self.memories)

    @property
    def block_ram_bits(self):
        return sum(memory.bits for memory in self.memories if memory.style == "block")

    # -- The MAC-bound floor.

    def macs(self, pos):
        """The MACs of the step at ``pos``: every layer's matrices (without the first's QKV
        where q, k and v come from a table) and attention, and the head's."""
        d, dff, vocab, layers = self.model.d_model, self.model.d_ff, self.model.vocab, self.model.n_layers
        matrices = layers * (4 * d * d + 2 * d * dff) - (3 * d * d if self.qkv.table else 0) + vocab * d
        return matrices + layers * 2 * (pos + 1) * d

    @property
    def lane_words(self):
        """The words the MAC lanes issue in a step that runs in full: the cycles they are busy."""
        return sum(self.lanes.matrices[index].steps * self.lanes.matrices[index].groups for index in self.lanes.order)

    @property
    def mean_macs(self):
        return sum(self.macs(p) for p in range(self.model.seq_len)) / self.model.seq_len

    @property
    def mac_multipliers(self):
        """The multipliers that do MACs: the lanes' and attention's, one per cache row a cycle."""
        return self.lanes.lanes * self.lanes.ways + self.model.d_model * self.shape.attention_rows

    @property
    def floor_cycles(self):
        """The MAC-bound floor: mean MACs per token over a context, over the MAC multipliers."""
        return self.mean_macs / self.mac_multipliers

    def to_json(self):
        """The plan as plain JSON values: records as objects, bounds as ``[lo, hi]``, rules as
        ``[M, S, relu, saturate]``, stages and matrices by name."""
        return _plain(self) | {"resources": {
            "MULT18X18D": self.dsp_blocks, "multipliers_by_unit": self.multipliers, "DP16KD": self.block_rams,
            "block_ram_bits": self.block_ram_bits, "floor_cycles": self.floor_cycles}}


def _plain(value):
    if isinstance(value, Bound):
        return [value.lo, value.hi]
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, ResultTable):
        return {"first": value.first, "last": value.last, "entries": len(value.entries)}
    if dataclasses.is_dataclass(value):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    return value


def _range_bits(count):
    """The width of an Amaranth ``range(count)``."""
    return max(0, (count - 1).bit_length())


def _memories(model, shape, embedding, qkv, lanes, feed_width, attention, cache, epilogue):
    d = model.d_model
    ways = shape.ways
    memories = [
        MemoryPlan("engine.embedding.token", "EinA, a word of columns per address", embedding.token_depth,
                   ways * embedding.token_bits, "block"),
        MemoryPlan("engine.embedding.position", "PinA, a word of columns per address", embedding.position_depth,
                   ways * embedding.position_bits, "block"),
    ]
    if qkv.table:
        memories.append(MemoryPlan("engine.qkv.table", "q, K[pos], V[pos] of every token and position", qkv.table_depth,
                                   3 * 8 * d, "block"))
    elif qkv.xi_table:
        memories.append(MemoryPlan("engine.qkv.xi_table", "xi of every token and position, a word per address",
                                   qkv.xi_depth, 8 * ways, "block"))
    for bank in range(len(lanes.banks)):
        memories.append(MemoryPlan(f"engine.matvec.weights{bank}", "every matrix's weights, a bank of lanes",
                                   lanes.depth, lanes.bank_width(bank), "block"))
    memories.append(MemoryPlan("engine.matvec.vector", "the input vector, replayed for a matrix's later groups",
                               max(lanes.steps), 8 * ways, "distributed"))
    words = -(-max(d, model.d_ff) // ways)
    memories.append(MemoryPlan("engine.feed.storage", "the lanes' input queue", words, feed_width, "distributed"))
    if lanes.hidden is not None:
        memories.append(MemoryPlan("engine.matvec.columns.storage", "the hidden pair's output words",
                                   lanes.steps[lanes.hidden.second],
                                   _lanes_output_width(lanes), "distributed"))
    for r in range(attention.rows):
        for g in range(attention.n_heads):
            memories.append(MemoryPlan(f"engine.attention.scores{r}_{g}", "a head's scores, a bank's rows",
                                       attention.groups, attention.score_bits,
                                       "distributed" if attention.shallow_scores else "block"))
    for r in range(attention.rows):
        memories.append(MemoryPlan(f"engine.attention.exp_lut{r}", "the exp table, as read", attention.exp_depth,
                                   max(1, attention.weight_bits), attention.exp_style))
    if attention.loaded:
        for k in range(ways):
            memories.append(MemoryPlan(f"engine.attention.ctx_table{k}", "r_ctx's results, every layer's",
                                       attention.ctx_table_depth, 8, "block"))
    memories.append(MemoryPlan("engine.attention.context.storage", "ci, a word of columns per entry", -(-d // ways),
                               ways * attention.ctx_bits + _range_bits(ways + 1) + 1 + _range_bits(attention.layers),
                               "distributed"))
    for bank in range(cache.banks):
        for name in "kv":
            memories.append(MemoryPlan(f"engine.cache.{name}{bank}", f"{name.upper()} rows, a bank's", cache.depth,
                                       cache.row_bits, "block"))
    for way in range(ways):
        for name, bound in epilogue.residual.vectors:
            memories.append(MemoryPlan(f"engine.epilogue{way}.residual.{name}", f"the residual stream's {name}",
                                       epilogue.columns, bound.bits, "distributed"))
    return memories


def _lanes_output_width(lanes):
    return (lanes.ways * lanes.acc_bits + _range_bits(max(lanes.cols) + lanes.lanes) + _range_bits(lanes.ways + 1)
            + _range_bits(len(lanes.matrices)) + 1)


def _device_memories(model, loadable):
    """The command protocol's memories, beside the engine's."""
    identity = [MemoryPlan("protocol.identity", "the committed model's sha256", 32, 8, "distributed")]
    return (identity if loadable else []) + [
        MemoryPlan("protocol.buffer", "a request's payload", MAX_PAYLOAD, 8, "distributed"),
        MemoryPlan("protocol.ident", "IDENT's reply", Ident.size(), 8, "logic"),
        MemoryPlan("protocol.pending.storage", "generated tokens, until a reply carries them", model.seq_len + 1, 8,
                   "distributed"),
    ]


def make_plan(model, shape=Shape(), part=None, *, bounds=None):
    """The :class:`Plan` of ``model`` in ``shape`` (its ``None`` fields decided for the model);
    with a ``part`` (a :class:`~.parts.Part` or its name), :class:`FitError` where the part is
    too small. ``bounds``: the model's :func:`~int8model.bounds.analyse`, where already made."""
    if isinstance(part, str):
        part = PARTS[part]
    if shape.attention_rows not in ATTENTION_ROWS:
        raise ValueError(f"attention reads 1, 2 or 4 cache rows a cycle, not {shape.attention_rows}")
    shape = shape.resolved(model)
    bounds = bounds or analyse(model)
    d, ways = model.d_model, shape.ways
    if shape.hidden_in_lanes and model.d_ff > shape.lanes:
        raise FitError(f"the hidden vector's {model.d_ff} elements do not fit the {shape.lanes} lanes")
    if model.n_layers > 1 and shape.qkv_table:
        raise FitError("the q, k, v table holds a one-layer model's q, k and v: a deep model's layers above the "
                       "first depend on more than the token and the position")
    if model.n_layers > 1 and shape.hidden_in_lanes:
        raise FitError("the hidden vector is kept in the lanes for one-layer models only")
    summary = ModelSummary(model.sha256, d, model.n_heads, model.d_ff, model.vocab, model.seq_len, model.nlut,
                           model.n_layers)
    xi_table = not shape.qkv_table and xi_table_fits(model, ways)
    stages = stage_plans(model, bounds, xi_dropped=shape.qkv_table or xi_table, hidden_table_limit=ResultTable.LIMIT)
    words = -(-d // ways)
    row_words = 1 << (words - 1).bit_length()
    bits = lambda table: Bound(int(table.min()), int(table.max())).bits
    embedding = EmbeddingPlan(d, model.vocab, model.seq_len, ways, words, row_words, bits(model.embed),
                              bits(model.positions), bounds.layers[0]["x"])
    pos_bits = (model.seq_len - 1).bit_length()
    qkv = QKVPlan("table" if shape.qkv_table else "computed", pos_bits, (row_words - 1).bit_length(),
                  qkv_table_depth(model), xi_table, xi_table_depth(model, ways))
    matrices = product_matrices(model)
    hidden = None
    if shape.hidden_in_lanes:
        hidden = (Matrix.W1, Matrix.W2, hidden_rules(model.requant), bounds["acc_h"])
    attention = attention_plan(model, bounds, ways=ways, rows=shape.attention_rows)
    return _assemble(summary, shape, part, bounds, stages, embedding, qkv, matrices, hidden, attention)


def _assemble(summary, shape, part, bounds, stages, embedding, qkv, matrices, hidden, attention, limits=None):
    """The rest of a plan, the same for a model's and a shape's: the lanes, the epilogue, the
    arg-max, the memories, and the fit."""
    ways = shape.ways
    head = head_index(summary.n_layers)
    input_bounds = [b[step.input] for b in bounds.layers for step in MATRICES[:LAYER_MATRICES]] + [bounds["oi"]]
    lanes = lanes_plan(matrices, shape.lanes, ways=ways, lut_ways=shape.lut_ways, input_bounds=input_bounds,
                       order=[index for index in range(head + 1) if index != Matrix.QKV or not shape.qkv_table],
                       whole=head, hidden=hidden)
    feed_width = 8 * ways + _range_bits(len(matrices))
    epilogue = epilogue_plan([stage for layer in stages for stage in layer], bounds, summary.d_model, summary.d_ff)
    cache = attention.cache
    # The head's logits go to the arg-max a whole group of lanes at once.
    argmax = argmax_plan(lanes.acc_bits, summary.vocab, shape.lanes)
    memories = _memories(summary, shape, embedding, qkv, lanes, feed_width, attention, cache, epilogue)
    memories += _device_memories(summary, limits is not None)
    plan = Plan(summary, part, shape, stages, embedding, qkv, lanes, -(-max(summary.d_model, summary.d_ff) // ways),
                epilogue, attention, cache, argmax, tuple(memories), limits,
                feed_registered=shape.lanes >= REGISTERED_FEED_LANES)
    if limits is not None:
        # A boot image where the part has the block RAM for a whole load's frames; else none.
        depth = -(-load_frame_bytes(plan) // BOOT_BLOCK) * BOOT_BLOCK
        image = MemoryPlan("boot.image", "the frames replayed at power-up (a model, once hdl.build --from wrote it)",
                           depth, 8, "block")
        booting = dataclasses.replace(plan, memories=plan.memories + (image,), boot_depth=depth)
        if part is None or booting.block_rams <= part.DP16KD:
            plan = booting
    if part is not None:
        check_fit(plan, part)
    return plan


def make_loadable_plan(limits, shape=Shape(), part=None):
    """The :class:`Plan` of a loadable build: for any model of ``limits``' shape within its
    limits (:class:`~.limits.Limits`), every width from :func:`~.limits.envelope`, every rule
    from registers (:class:`~.arithmetic.LoadedRule`), and none of the tables made of a model's
    values: q, k and v computed, xi made by the epilogue, the hidden vector through the
    epilogue; its ``model`` the shape, with no identity."""
    if isinstance(part, str):
        part = PARTS[part]
    if shape.attention_rows not in ATTENTION_ROWS:
        raise ValueError(f"attention reads 1, 2 or 4 cache rows a cycle, not {shape.attention_rows}")
    if limits.multiplier_bits > RULE_MULTIPLIER_BITS:
        raise FitError(f"a loadable build's requant multipliers are at most {RULE_MULTIPLIER_BITS}-bit, "
                       f"not {limits.multiplier_bits}")
    if shape.qkv_table or shape.hidden_in_lanes:
        raise FitError("a loadable build computes q, k and v, and the hidden vector in the epilogue: "
                       "their tables are made of a model's values")
    shape = dataclasses.replace(shape, lanes=shape.lanes or lanes_for(limits, shape.ways), qkv_table=False)
    layers, top = envelope(limits)
    bounds = ModelBounds(layers, top)
    d, ways = limits.d_model, shape.ways
    summary = ModelSummary("", d, limits.n_heads, limits.d_ff, limits.vocab, limits.seq_len,
                           1 << (limits.max_nlut - 1).bit_length(), limits.n_layers)
    stages = stage_plans(None, bounds, xi_dropped=False, hidden_table_limit=0, limits=limits)
    words = -(-d // ways)
    row_words = 1 << (words - 1).bit_length()
    embedding = EmbeddingPlan(d, limits.vocab, limits.seq_len, ways, words, row_words, limits.embedding_bits,
                              limits.embedding_bits, layers[0]["x"])
    qkv = QKVPlan("computed", (limits.seq_len - 1).bit_length(), (row_words - 1).bit_length(), 0, False, 0)
    # Every weight -128: the accumulators' widest, as the envelope has them.
    extreme = lambda rows, cols: np.full((rows, cols), -128)
    per_layer = [extreme(d, 3 * d), extreme(d, d), extreme(d, limits.d_ff), extreme(limits.d_ff, d)]
    matrices = per_layer * limits.n_layers + [extreme(d, limits.vocab)]
    attention = loaded_attention_plan(limits, bounds, ways=ways, rows=shape.attention_rows)
    return _assemble(summary, shape, part, bounds, stages, embedding, qkv, matrices, None, attention, limits)


def check_fit(plan, part):
    short = []
    if plan.block_rams > part.DP16KD:
        short.append(f"block RAM: {plan.block_rams} DP16KD ({plan.block_ram_bits} bits of memories), "
                     f"the {part.device} has {part.DP16KD} ({part.DP16KD * BLOCK_BITS} bits)")
    if plan.dsp_blocks > part.MULT18X18D:
        shape, model = plan.shape, plan.model
        short.append(f"multipliers: {plan.dsp_blocks} MULT18X18D "
                     f"({shape.lanes} MAC lanes x {shape.ways} way{'s' if shape.ways > 1 else ''}"
                     + (f", {shape.lut_ways} of them in LUTs" if shape.lut_ways else "")
                     + f" + {plan.attention.multipliers} attention"
                     + f" ({model.n_heads * shape.attention_rows} score scales among them)"
                     + f" + {plan.multipliers['epilogues']} requants), the {part.device} has {part.MULT18X18D}")
    if short:
        raise FitError(f"the model does not fit the ULX3S-{part.name}: " + "; ".join(short)
                       + ". Try a larger part (--device) or fewer lanes (--lanes).")


def candidate_shapes(model, asked):
    """The shapes a build may take, of those ``asked`` leaves open (``asked.lanes`` ``None``,
    ``asked.ways`` ``None``, ``asked.lut_ways`` ``None``): up to ``MAX_WAYS``; lanes a
    d_model-wide product's, or a half or a quarter of them (rounded up to whole words: a group
    of lanes ends on a word); at most one of a lane's multipliers in LUTs (a LUT multiplier
    costs one to two hundred LUT4s)."""
    for ways in [asked.ways] if asked.ways else range(MAX_WAYS, 0, -1):
        lane_counts = [asked.lanes] if asked.lanes else sorted({lanes_for(model, ways, share) for share in (1, 2, 4)},
                                                               reverse=True)
        for soft in [asked.lut_ways] if asked.lut_ways is not None else (0, 1):
            for lanes in lane_counts:
                if lanes % ways == 0:  # a group of lanes ends on a word
                    yield dataclasses.replace(asked, lanes=lanes, ways=ways, lut_ways=soft)


def choose_plan(model, part, asked=None, *, limits=None):
    """The plan to build ``model`` with on ``part``: the shape ``asked`` where it is whole, else,
    of the shapes that fit (:func:`candidate_shapes`), the one with the most MAC multipliers,
    then the most ways (a vector in fewer words streams from one matrix into the next in fewer
    cycles), then the fewest in LUTs; q, k and v from a table where the model's is small and the
    part has the block RAM. ``asked``: a :class:`~.shape.Shape` whose ``lanes``, ``ways`` and
    ``lut_ways`` may be ``None`` (the part's choice). Where none fits, the refusal of the last
    (and least) shape. With ``limits``, a loadable build's (:func:`make_loadable_plan`; ``model``
    unused)."""
    if isinstance(part, str):
        part = PARTS[part]
    asked = asked or Shape(ways=None, lut_ways=None)
    if limits is not None:
        model, tables = limits, (False,)
        make = lambda shape: make_loadable_plan(limits, shape, part)
    else:
        bounds, tables = analyse(model), (None, False)
        make = lambda shape: make_plan(model, shape, part, bounds=bounds)
    best, error = None, None
    for candidate in candidate_shapes(model, asked):
        for table in [asked.qkv_table] if asked.qkv_table is not None else tables:
            try:
                plan = make(dataclasses.replace(candidate, qkv_table=table))
            except FitError as refused:
                error = refused
                continue
            rank = (plan.shape.lanes * plan.shape.ways, plan.shape.ways, -plan.shape.lut_ways)
            if best is None or rank > best[0]:
                best = rank, plan
            break
    if best is None:
        raise error
    return best[1]
