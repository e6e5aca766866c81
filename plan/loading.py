"""What a loadable build's memories take from the line: which ``LOAD`` memory is which, and a
model's bytes for each (docs/loading.md).

Each memory is written a word at a time; a word takes a power of two of bytes (its bits
little-endian, zero above its width), so that a byte's place in its word is the address's low
bits. The rule registers are a memory of their own: a word per rule, its multiplier in the
low 24 bits (two's complement), its shift in the top byte.
"""

from dataclasses import dataclass

import numpy as np

from wire import REQUEST_SYNC
from wire.frames import load_frames

from .arithmetic import Rule
from .attention import exp_entries
from .contents import embedding_words
from .lanes import bank_words, weight_table
from .limits import check_limits
from .schedule import STAGES, Stage, product_matrices

__all__ = ["LoadTarget", "load_targets", "RuleLayout", "rule_values", "load_images", "RULE_MULTIPLIER_BITS",
           "BOOT_BLOCK", "load_frame_bytes", "boot_pattern", "boot_image"]

RULE_MULTIPLIER_BITS = 24  # a rule word's multiplier field; the limits' multipliers are at most this wide

# The boot image's depth is whole block RAMs of 2048 × 9 (ecpbram rewrites 512-word slices).
BOOT_BLOCK = 2048


@dataclass(frozen=True)
class LoadTarget:
    """A memory ``LOAD`` writes: its ``index`` on the line, ``depth`` words of ``width`` bits."""
    index: int
    name: str
    depth: int
    width: int

    @property
    def word_bytes(self):
        return 1 << (-(-self.width // 8) - 1).bit_length()

    @property
    def size(self):
        """Its image's bytes."""
        return self.depth * self.word_bytes


@dataclass(frozen=True)
class RuleLayout:
    """The rule registers: each stage's first and last requant (``Stage`` of every layer, by
    ``select``), then each layer's ``M_score``."""
    selects: int
    layers: int

    WIDTH = 32

    def first(self, select):
        return select

    def last(self, select):
        return self.selects + select

    def score(self, layer):
        return 2 * self.selects + layer

    @property
    def count(self):
        return 2 * self.selects + self.layers


def rule_layout(plan):
    return RuleLayout(plan.epilogue.selects, plan.attention.layers)


def load_targets(plan):
    """The memories of a loadable ``plan``, by their index on the line."""
    if not plan.loadable:
        raise ValueError("a baked build takes no LOAD")
    embedding, attention, lanes = plan.embedding, plan.attention, plan.lanes
    targets = [
        ("rules", rule_layout(plan).count, RuleLayout.WIDTH),
        ("token_embedding", embedding.token_depth, embedding.ways * embedding.token_bits),
        ("position_embedding", embedding.position_depth, embedding.ways * embedding.position_bits),
        ("exp_table", attention.exp_depth, max(1, attention.weight_bits)),
        ("ctx_table", attention.ctx_table_depth, 8),
    ] + [(f"weights{bank}", lanes.depth, lanes.bank_width(bank)) for bank in range(len(lanes.banks))]
    return tuple(LoadTarget(index, name, depth, width) for index, (name, depth, width) in enumerate(targets))


def rule_values(model):
    """The model's rules as the registers take them, ``(multiplier, shift)`` in the order of
    :class:`RuleLayout`: each stage's first pair and last pair (``(0, 0)`` where the stage
    skips that requant; a layer's ``F`` ends in the next layer's ``r_qkv``, the top's in
    ``r_out``), then each layer's ``M_score``."""
    first, last = [], []
    for index, layer in enumerate(model.layers):
        requant = layer.requant
        for step in STAGES:
            first.append(tuple(requant[step.first]) if step.first else (0, 0))
            if step.stage == Stage.F:
                pair = model.layers[index + 1].requant["r_qkv"] if index + 1 < model.n_layers else model.r_out
            else:
                pair = requant[step.last] if step.last else (0, 0)
            last.append(tuple(pair))
    scores = [tuple(layer.requant["M_score"]) for layer in model.layers]
    return [(int(m), int(s)) for m, s in first + last + scores]


def _pack(values, bits, word_bytes):
    """Words of ``values`` (one list of entries per word, each ``bits`` wide, two's complement)
    as bytes."""
    out = bytearray()
    mask = (1 << bits) - 1
    for word in values:
        number = sum((int(value) & mask) << (bits * at) for at, value in enumerate(word))
        out += number.to_bytes(word_bytes, "little")
    return bytes(out)


def load_images(plan, model):
    """The bytes of each memory of a loadable ``plan`` for ``model``: ``{index: bytes}``, after
    :func:`~.limits.check_limits` (a :class:`~.limits.LimitError` naming the field, the layer
    and the limit for a model the build cannot take)."""
    check_limits(model, plan.limits)
    targets = {target.name: target for target in load_targets(plan)}
    embedding, attention, lanes = plan.embedding, plan.attention, plan.lanes
    images = {}

    def put(name, words, bits):
        images[targets[name].index] = _pack(words, bits, targets[name].word_bytes)
    rules = [[m | (s << RULE_MULTIPLIER_BITS)] for m, s in
             ((m & ((1 << RULE_MULTIPLIER_BITS) - 1), s) for m, s in rule_values(model))]
    put("rules", rules, RuleLayout.WIDTH)
    put("token_embedding", embedding_words(model.embed, embedding.row_words, embedding.ways), embedding.token_bits)
    put("position_embedding", embedding_words(model.positions, embedding.row_words, embedding.ways),
        embedding.position_bits)
    put("exp_table", [[v] for v in exp_entries(attention, model.exp_lut)], max(1, attention.weight_bits))
    ctx = []
    for layer in model.layers:
        rule = Rule.to8(layer.requant["r_ctx"])
        ctx += [[rule.apply(q - 256 if q > 127 else q)] for q in range(attention.CTX_ENTRIES)]
    put("ctx_table", ctx, 8)
    table = weight_table(lanes, product_matrices(model))
    for bank in range(len(lanes.banks)):
        put(f"weights{bank}", [[word] for word in bank_words(lanes, table, bank)], lanes.bank_width(bank))
    return images


def load_frame_bytes(plan):
    """The bytes of the request frames that load a model into ``plan``'s memories and commit
    it: :func:`wire.frames.load_frames` of images of their sizes (the frames' lengths depend on
    nothing else)."""
    return len(load_frames({target.index: bytes(target.size) for target in load_targets(plan)}, "00" * 32))


def boot_pattern(depth):
    """A loadable build's boot image as synthesised: bytes no rewrite has touched, random so
    that ecpbram finds each 512-word slice of them in the bitstream and nowhere else, and never
    the request's sync byte, so that at power-up the protocol hears no frame in them (and runs
    no model)."""
    values = np.random.default_rng(0xB007).integers(0, 255, depth)
    return bytes((values + (values >= REQUEST_SYNC)).astype(np.uint8))


def boot_image(plan, model):
    """A loadable ``plan``'s boot image holding ``model``: its load's frames, then zeros to
    ``plan.boot_depth`` bytes (:class:`hdl.boot.BootReplay` replays them at power-up; a model
    outside the build's limits is refused, :func:`load_images`)."""
    if not plan.boot:
        raise ValueError("this build holds no boot image: a whole load's frames do not fit beside it")
    frames = load_frames(load_images(plan, model), model.sha256)
    if len(frames) > plan.boot_depth:
        raise ValueError(f"a load takes {len(frames)} bytes of frames; the boot image holds {plan.boot_depth}")
    return frames + bytes(plan.boot_depth - len(frames))
