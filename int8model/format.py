"""The int8 model file: loading, validation and identity.

A model file is JSON with the keys ``config``, ``requant``, ``weights_int8``, ``embed_stream`` and
``exp_lut`` (see docs/semantics.md). A deep model (``config.n_layers`` L) gives each per-layer
requant pair and matrix as a list of L, layer 0 first; ``r_out``, ``Eq``, the embeddings and the
exp table stay single. A file without ``n_layers`` is a one-layer model, and the two spellings of
a one-layer model are the same model, with the same identity. Any other top-level key (a
tokenizer, metadata) is kept as it is but takes no part in the model's identity, which covers
only what decides the integer arithmetic.
"""

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["ModelError", "Model", "Layer", "REQUANTS", "WEIGHTS", "LAYER_REQUANTS", "LAYER_WEIGHTS", "load",
           "loads"]

#: The twelve requant pairs, in the order the model file lists them.
REQUANTS = ("r_qkv", "r_ffn", "r_out", "r_ctx", "r_hid",
            "M_q", "M_k", "M_v", "M_o", "M_h", "M_f", "M_score")

#: The int8 weight matrices, in the order the model file lists them.
WEIGHTS = ("Wq", "Wk", "Wv", "Wo", "W1", "W2", "Eq")

#: The requant pairs and matrices each layer of a deep model has its own of; the rest are shared.
LAYER_REQUANTS = tuple(key for key in REQUANTS if key != "r_out")
LAYER_WEIGHTS = tuple(key for key in WEIGHTS if key != "Eq")

#: A token travels as one byte.
MAX_VOCAB = 256

CONFIG_KEYS = ("d_model", "n_heads", "d_ff", "vocab", "seq_len")
SEMANTIC_KEYS = ("config", "requant", "weights_int8", "embed_stream", "exp_lut")


class ModelError(ValueError):
    """A model file that is not a valid one-layer int8 model; the message names the key."""


@dataclass(frozen=True, eq=False)
class Layer:
    """One layer's parameters: ``requant`` holds its own pairs and the shared ``r_out``,
    ``weights`` its own matrices and the shared ``Eq``, so that a layer reads as the one-layer
    model's keys do."""
    requant: dict          # name -> (M, S)
    weights: dict          # name -> 2-D int64 array


@dataclass(frozen=True, eq=False)
class Model:
    """A validated model. Arrays are read-only ``int64``; matrices keep their stored shapes.

    ``layers[l].weights["Wq"]`` is ``d × d`` input-major (``y = x @ W``), ``["W1"]`` is
    ``d × d_ff``, ``["W2"]`` is ``d_ff × d`` and ``["Eq"]`` (shared) is ``vocab × d``.
    """
    d_model: int
    n_heads: int
    d_ff: int
    vocab: int
    seq_len: int
    layers: tuple
    embed: np.ndarray      # EinA, vocab × d
    positions: np.ndarray  # PinA, seq_len × d
    exp_lut: np.ndarray    # NLUT
    extra: dict = field(default_factory=dict)

    @property
    def n_layers(self):
        return len(self.layers)

    @property
    def requant(self):
        """A one-layer model's requant pairs (a deep model's are its layers')."""
        return self._one_layer().requant

    @property
    def weights(self):
        """A one-layer model's matrices (a deep model's are its layers')."""
        return self._one_layer().weights

    def _one_layer(self):
        if self.n_layers != 1:
            raise ModelError(f"a model of {self.n_layers} layers has its requant pairs and matrices by layer")
        return self.layers[0]

    @property
    def r_out(self):
        return self.layers[-1].requant["r_out"]

    @property
    def head(self):
        """``Eq``, the tied head: vocab × d."""
        return self.layers[-1].weights["Eq"]

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    @property
    def nlut(self):
        return len(self.exp_lut)

    @property
    def shape(self):
        shape = {"d_model": self.d_model, "n_heads": self.n_heads, "d_ff": self.d_ff,
                 "vocab": self.vocab, "seq_len": self.seq_len}
        if self.n_layers > 1:
            shape["n_layers"] = self.n_layers
        return shape

    def to_json(self):
        """The model file's content as a JSON-ready dict (extras included); a one-layer model in
        the seed's spelling, without ``n_layers``."""
        doc = dict(self.extra)
        doc["config"] = self.shape
        deep = self.n_layers > 1

        def per_layer(values):
            return values if deep else values[0]
        doc["requant"] = {k: list(self.r_out) if k == "r_out" else
                          per_layer([list(layer.requant[k]) for layer in self.layers]) for k in REQUANTS}
        doc["weights_int8"] = {k: self.head.ravel().tolist() if k == "Eq" else
                               per_layer([layer.weights[k].ravel().tolist() for layer in self.layers])
                               for k in WEIGHTS}
        doc["embed_stream"] = {"EinA": self.embed.ravel().tolist(),
                               "PinA": self.positions.ravel().tolist()}
        doc["exp_lut"] = self.exp_lut.tolist()
        return doc

    @property
    def sha256(self):
        """SHA-256 over the canonical serialisation of the model's semantic content.

        Key order and whitespace in the file do not change it; extras do not either; nor does
        the spelling of a one-layer model (with or without ``n_layers``).
        """
        doc = self.to_json()
        canonical = json.dumps({k: doc[k] for k in SEMANTIC_KEYS},
                               sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def identity_line(self):
        return f"model sha256 {self.sha256}"

    def save(self, path):
        Path(path).write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n")

    @property
    def tokenizer(self):
        """The characters of the model's tokenizer, or ``None`` if it has none."""
        tok = self.extra.get("tokenizer")
        if isinstance(tok, dict) and isinstance(tok.get("chars"), str):
            return tok["chars"]
        return None


def _is_int(value):
    # JSON's true/false arrive as bool, a subclass of int: they are not integers here.
    return isinstance(value, int) and not isinstance(value, bool)


def _section(doc, key):
    if key not in doc:
        raise ModelError(f"missing key {key!r}")
    if not isinstance(doc[key], dict) and key != "exp_lut":
        raise ModelError(f"{key!r} must be an object, not {type(doc[key]).__name__}")
    return doc[key]


def _ints(value, where, length=None, lo=None, hi=None):
    if not isinstance(value, list):
        raise ModelError(f"{where} must be an array of integers, not {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ModelError(f"{where} holds {len(value)} values, expected {length}")
    for i, item in enumerate(value):
        if not _is_int(item):
            raise ModelError(f"{where}[{i}] is {item!r}, not an integer")
        if lo is not None and not lo <= item <= hi:
            raise ModelError(f"{where}[{i}] is {item}, outside the int8 range [{lo}, {hi}]")
    return np.array(value, dtype=object)


def _as_int64(values, where):
    # Embeddings and the exp table are wide but must fit the reference's 64-bit integers.
    for i, item in enumerate(values):
        if not -2**63 <= item < 2**63:
            raise ModelError(f"{where}[{i}] is {item}, outside the signed 64-bit range")
    array = np.array(values.tolist(), dtype=np.int64)
    array.setflags(write=False)
    return array


def from_json(doc):
    """Validate a parsed model file and return a :class:`Model`; raise :class:`ModelError`."""
    if not isinstance(doc, dict):
        raise ModelError(f"a model file holds a JSON object, not {type(doc).__name__}")

    config = _section(doc, "config")
    sizes = {}
    for key in CONFIG_KEYS:
        if key not in config:
            raise ModelError(f"missing key 'config.{key}'")
        value = config[key]
        if not _is_int(value) or value <= 0:
            raise ModelError(f"config.{key} is {value!r}, not a positive integer")
        sizes[key] = value
    d, heads, d_ff, vocab, seq_len = (sizes[k] for k in CONFIG_KEYS)
    if d % heads != 0:
        raise ModelError(f"config.n_heads {heads} does not divide config.d_model {d}")
    if vocab > MAX_VOCAB:
        raise ModelError(f"config.vocab is {vocab}; a token travels as one byte, so at most {MAX_VOCAB}")

    layers = 1
    if "n_layers" in config:
        layers = config["n_layers"]
        if not _is_int(layers) or layers <= 0:
            raise ModelError(f"config.n_layers is {layers!r}, not a positive integer")
    deep = "n_layers" in config

    def per_layer(section, key, what):
        """The key's value for each layer: a list of ``layers`` of them where the file gives
        ``n_layers``, else the one value."""
        value = section[key]
        if not deep:
            return [(value, f"{section_name}.{key}")]
        if not isinstance(value, list) or len(value) == 0 or not isinstance(value[0], list):
            raise ModelError(f"{section_name}.{key} must be a list of {layers} {what}s, one per layer "
                             f"(config.n_layers is {layers}), not a single {what}")
        if len(value) != layers:
            raise ModelError(f"{section_name}.{key} holds {len(value)} {what}s, expected {layers} "
                             f"(config.n_layers is {layers})")
        return [(item, f"{section_name}.{key}[layer {l}]") for l, item in enumerate(value)]

    section_name = "requant"
    section = _section(doc, section_name)
    requant = [{} for _ in range(layers)]
    for key in REQUANTS:
        if key not in section:
            raise ModelError(f"missing key 'requant.{key}'")
        values = per_layer(section, key, "[M, S] pair") if key in LAYER_REQUANTS else \
            [(section[key], f"requant.{key}")] * layers
        for l, (pair, where) in enumerate(values):
            requant[l][key] = _pair(pair, where)

    section_name = "weights_int8"
    section = _section(doc, section_name)
    shapes = {"Wq": (d, d), "Wk": (d, d), "Wv": (d, d), "Wo": (d, d),
              "W1": (d, d_ff), "W2": (d_ff, d), "Eq": (vocab, d)}
    weights = [{} for _ in range(layers)]
    for key in WEIGHTS:
        if key not in section:
            raise ModelError(f"missing key 'weights_int8.{key}'")
        rows, cols = shapes[key]
        if key in LAYER_WEIGHTS:
            values = per_layer(section, key, "array")
        else:
            values = [(section[key], f"weights_int8.{key}")]
        for l, (value, where) in enumerate(values):
            array = _as_int64(_ints(value, where, rows * cols, -128, 127), where).reshape(rows, cols)
            for target in (weights[l:l + 1] if key in LAYER_WEIGHTS else weights):
                target[key] = array

    section = _section(doc, "embed_stream")
    tables = {}
    for key, rows in (("EinA", vocab), ("PinA", seq_len)):
        if key not in section:
            raise ModelError(f"missing key 'embed_stream.{key}'")
        values = _ints(section[key], f"embed_stream.{key}", rows * d)
        tables[key] = _as_int64(values, f"embed_stream.{key}").reshape(rows, d)

    values = _ints(_section(doc, "exp_lut"), "exp_lut")
    if len(values) == 0:
        raise ModelError("exp_lut is empty; the softmax needs at least one entry")
    if values[0] <= 0:
        raise ModelError(f"exp_lut[0] is {values[0]}; it must be > 0 so that the denominator is positive")
    for i, item in enumerate(values):
        # A negative weight could make the softmax's denominator zero or negative.
        if item < 0:
            raise ModelError(f"exp_lut[{i}] is {item}; the exp table holds no negative weights")
    exp_lut = _as_int64(values, "exp_lut")

    extra = {k: v for k, v in doc.items() if k not in SEMANTIC_KEYS}
    return Model(d, heads, d_ff, vocab, seq_len, tuple(Layer(r, w) for r, w in zip(requant, weights)),
                 tables["EinA"], tables["PinA"], exp_lut, extra)


def _pair(pair, where):
    if not isinstance(pair, list) or len(pair) != 2:
        raise ModelError(f"{where} must be an [M, S] pair, not {pair!r}")
    multiplier, shift = pair
    if not _is_int(multiplier):
        raise ModelError(f"{where}'s multiplier {multiplier!r} is not an integer")
    if not _is_int(shift) or not 0 <= shift <= 63:
        raise ModelError(f"{where}'s shift {shift!r} is outside 0..63")
    if not -2**63 <= multiplier < 2**63:
        raise ModelError(f"{where}'s multiplier {multiplier} is outside the signed 64-bit range")
    return (multiplier, shift)


def loads(text):
    """Parse and validate a model file's text."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelError(f"not JSON: {error}") from None
    return from_json(doc)


def load(path):
    """Read, parse and validate a model file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ModelError(f"cannot read {path}: {error.strerror}") from None
    try:
        return loads(text)
    except ModelError as error:
        raise ModelError(f"{path}: {error}") from None
