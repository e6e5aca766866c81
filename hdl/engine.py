from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In

from plan.loading import load_targets, rule_layout
from plan.schedule import LAYER_MATRICES, MATRICES, Matrix, Stage, matrix_index

from .argmax import ArgMax
from .attention import Attention
from .embedding import Embedding
from .epilogue import Epilogue
from .fifo import RegisterSlice, SkidBuffer, StreamFIFO
from .interface import EngineControl
from .kv_cache import KVCache
from .loader import ModelLoader, RuleRegisters
from .matvec import MatVec
from .matvec_hidden import HiddenMatVec
from .mux import PriorityMux, mapped
from .protocol import load_layout
from .qkv import QKVComputed, QKVTable
from .sequencer import Sequencer

__all__ = ["Engine"]


class Engine(wiring.Component):
    """The decode engine: a whole decode step (docs/semantics.md, steps 1–7) in hardware, and generation.

    The :class:`~.sequencer.Sequencer` drives the units through a step, as the plan's table of
    stages (:mod:`plan.schedule`) routes the values between them: the :class:`~.embedding.Embedding`
    feeds the :class:`~.epilogue.Epilogue`, whose int8 outputs stream into the
    :class:`~.matvec.MatVec` lanes, whose sums stream back through the epilogue into the next
    product; q, k and v come from the :class:`~.qkv.QKVSource` (a table, or the QKV product)
    for the :class:`~.kv_cache.KVCache` and the :class:`~.attention.Attention` unit, whose
    context feeds the output projection; the head's logits go into the :class:`~.argmax.ArgMax`
    a whole group of lanes at once. Products overlap: each vector streams into the next matrix
    while it is still leaving the previous one. Vectors move ``ways`` elements a cycle, as
    words: ``ways`` epilogues work side by side, element k of every word on epilogue k.

    Parameters
    ----------
    plan : :class:`plan.Plan`
        Every unit's parameters and widths, and the step's stages.
    contents : :class:`plan.Contents` or ``None``
        The memories' initial values (the model's weights, embeddings and tables); ``None``:
        zero.

    Ports
    -----
    cmd, tokens, status : :class:`~.interface.EngineControl`'s, seen from the engine.
    load : ``In(stream.Signature(load_layout()))``, a loadable build's (``plan.loadable``): the
        protocol's bytes of a model, into the memories and the rule registers, while no step runs.
    """

    def __init__(self, plan, contents=None):
        self.plan = plan
        ways = plan.shape.ways
        if plan.loadable:
            if contents is not None:
                raise ValueError("a loadable build's memories start empty: its model comes over the line")
            # The model's bytes into words, into the memories and the rule registers.
            self.loader = ModelLoader(load_targets(plan))
            self.rules = RuleRegisters(rule_layout(plan), plan.limits.multiplier_bits)
        else:
            self.rules = None
        # One epilogue per element of a word: they move in step, each on its own column.
        self.epilogues = [Epilogue(plan.epilogue, self.rules) for _ in range(ways)]
        lanes = HiddenMatVec if plan.lanes.hidden is not None else MatVec
        self.matvec = lanes(plan.lanes, contents and contents.weights, loadable=plan.loadable)
        self.attention = Attention(plan.attention, contents and contents.exp_entries, rules=self.rules)
        self.cache = KVCache(plan.cache)
        # The head's logits go to the arg-max a whole group of lanes at once, not a word at a time.
        self.argmax = ArgMax(plan.argmax)
        # A whole vector fits in the lanes' input queue: while the lanes still replay one
        # matrix's groups, the first results already flow into the next matrix's input.
        # A word that finds the queue empty and the lanes ready goes straight in. Wide lanes
        # decide their issue on a head from a register (plan.plan.REGISTERED_FEED_LANES).
        self.feed = StreamFIFO(self.matvec.i.payload.shape(), plan.feed_depth, fall_through=True,
                               registered_head=plan.feed_registered)
        self.embedding = Embedding(plan.embedding, plan.epilogue.scratch, contents and contents.token_embedding,
                                   contents and contents.position_embedding, loadable=plan.loadable)
        collected = self.epilogues[0].o.payload.shape()
        if plan.qkv.table:
            self.qkv = QKVTable(plan, collected, self.feed.i.payload.shape(), contents and contents.qkv_rows)
        else:
            self.qkv = QKVComputed(plan, collected, self.feed.i.payload.shape(), contents and contents.xi_words)
        self.sequencer = Sequencer(plan)
        signature = EngineControl(plan.model.seq_len).flip()
        if plan.loadable:
            signature = wiring.Signature({**signature.members, "load": In(stream.Signature(load_layout()))})
        super().__init__(signature)

    def elaborate(self, platform):
        m = Module()
        plan = self.plan
        d, ways = plan.model.d_model, plan.shape.ways
        epilogues = self.epilogues
        for k, epilogue in enumerate(epilogues):
            m.submodules[f"epilogue{k}"] = epilogue
        for name in ("matvec", "attention", "cache", "argmax", "feed", "embedding", "qkv", "sequencer"):
            m.submodules[name] = getattr(self, name)
        matvec, attention, cache, qkv, sequencer = self.matvec, self.attention, self.cache, self.qkv, self.sequencer
        if plan.loadable:
            m.submodules.loader = loader = self.loader
            m.submodules.rules = self.rules
            wiring.connect(m, wiring.flipped(self.load), loader.i)
            wiring.connect(m, loader.rules, self.rules.load)
            wiring.connect(m, loader.token_embedding, self.embedding.load_token)
            wiring.connect(m, loader.position_embedding, self.embedding.load_position)
            wiring.connect(m, loader.exp_table, attention.load_exp)
            wiring.connect(m, loader.ctx_table, attention.load_ctx)
            for bank in range(len(plan.lanes.banks)):
                wiring.connect(m, getattr(loader, f"weights{bank}"), getattr(matvec, f"load{bank}"))
        wiring.connect(m, attention.cache, cache.read)
        wiring.connect(m, self.feed.o, matvec.i)
        wiring.connect(m, matvec.w, self.argmax.i)
        wiring.connect(m, self.argmax.o, sequencer.head)
        wiring.connect(m, sequencer.embed, self.embedding.start)
        wiring.connect(m, sequencer.qkv_start, qkv.start)
        wiring.connect(m, wiring.flipped(self.cmd), sequencer.cmd)
        wiring.connect(m, sequencer.tokens, wiring.flipped(self.tokens))
        m.d.comb += [
            self.status.eq(sequencer.status),
            qkv.ahead.eq(sequencer.ahead),
            qkv.next_layer.eq(sequencer.next_layer),
            sequencer.have_q.eq(qkv.have_q), sequencer.have_k.eq(qkv.have_k), sequencer.have_v.eq(qkv.have_v),
            # The cache row and the query: q, k and v as the source has them, at the step's position.
            cache.write.valid.eq(sequencer.cache_write),
            cache.write.payload.pos.eq(sequencer.pos),
            cache.write.payload.k.eq(qkv.k),
            cache.write.payload.v.eq(qkv.v),
            attention.i.valid.eq(sequencer.query_valid),
            sequencer.query_ready.eq(attention.i.ready),
            attention.i.payload.q.eq(qkv.q),
            attention.i.payload.pos.eq(sequencer.pos),
            attention.keys_ready.eq(sequencer.keys_ready),
            attention.values_ready.eq(sequencer.values_ready),
        ]
        if plan.model.n_layers > 1:  # the layer's own cache rows, M_score and r_ctx
            m.d.comb += [cache.write.payload.layer.eq(sequencer.layer), attention.i.payload.layer.eq(sequencer.layer)]
        self._probes(m)

        # -- Into the epilogues: the embedding's words (first), or the lanes' sums, through a
        # skid buffer (so that the epilogues' readiness stops at its register and does not run
        # on into the lanes' output and the embedding) and a register slice (the routing is
        # logic on another unit's output, the epilogues start with a multiplier).
        routed_shape = data.ArrayLayout(epilogues[0].i.payload.shape(), ways)
        m.submodules.into_epilogues = into = PriorityMux(routed_shape, 2)
        m.submodules.routing = routing = SkidBuffer(routed_shape)
        m.submodules.routed = routed = RegisterSlice(routed_shape)
        wiring.connect(m, mapped(m, self.embedding.o, routed_shape, self._embedded_words), into.i[0])
        wiring.connect(m, mapped(m, matvec.o, routed_shape, self._lanes_words), into.i[1])
        wiring.connect(m, into.o, routing.i)
        wiring.connect(m, routing.o, routed.i)
        for k, epilogue in enumerate(epilogues):
            m.d.comb += [epilogue.i.valid.eq(routed.o.valid), epilogue.i.payload.eq(routed.o.payload[k])]
        m.d.comb += routed.o.ready.eq(epilogues[0].i.ready)

        # -- Out of the epilogues: a word whose stage goes to no product (q, k, v, or xi where
        # it comes from a table) to the q, k, v source, which always takes it; any other into
        # the lanes' input, after attention's context and the xi table's words.
        select = epilogues[0].o.payload.select
        collected = Cat(select == s.select for s in plan.all_stages if s.output != "lanes").any()
        for k, epilogue in enumerate(epilogues):
            m.d.comb += qkv.collect.payload[k].eq(epilogue.o.payload)
        m.d.comb += qkv.collect.valid.eq(epilogues[0].o.valid & collected)
        feed_shape = self.feed.i.payload.shape()
        m.submodules.into_lanes = into_lanes = PriorityMux(feed_shape, 3)
        layers = plan.model.n_layers
        context = mapped(m, attention.o, feed_shape, lambda source, word: [
            # Into the WO product of the layer whose context it is.
            word.matrix.eq(Matrix.WO if layers == 1 else
                           Array(Const(matrix_index(layer, Matrix.WO)) for layer in range(layers))[source.layer]),
            *(word.values[k].eq(source.values[k]) for k in range(ways))])
        next_matrix = Array(Const(s.feeds or 0) for s in plan.all_stages)
        words = into_lanes.i[2]
        if plan.feed_registered:  # wide lanes: their input is far from attention and the epilogues (plan.plan)
            m.submodules.context_words = registered_context = RegisterSlice(feed_shape)
            wiring.connect(m, context, registered_context.i)
            context = registered_context.o
            m.submodules.epilogue_words = registered = RegisterSlice(feed_shape)
            wiring.connect(m, registered.o, into_lanes.i[2])
            words = registered.i
        wiring.connect(m, context, into_lanes.i[0])
        wiring.connect(m, qkv.xi, into_lanes.i[1])
        m.d.comb += [
            words.valid.eq(epilogues[0].o.valid & ~collected),
            words.payload.matrix.eq(next_matrix[select]),
            *(words.payload.values[k].eq(epilogue.o.payload.value) for k, epilogue in enumerate(epilogues)),
            *(epilogue.o.ready.eq(collected | words.ready) for epilogue in epilogues),
        ]
        wiring.connect(m, into_lanes.o, self.feed.i)
        return m

    def _embedded_words(self, source, word):
        # EMBED skips the first requant: its multiplier is never used.
        return [assignment for k in range(self.plan.shape.ways) for assignment in (
            word[k].value.eq(source[k].value), word[k].tag.eq(source[k].tag),
            word[k].select.eq(Stage.EMBED), word[k].multiplier.eq(0),
            *([word[k].shift.eq(0)] if self.plan.loadable else []))]

    def _lanes_words(self, product, word):
        """The lanes' sums as the epilogues take them: each element with its stage (the
        matrix's, or, for QKV, Q, K or V by column; a deep model's, of the matrix's layer), its
        column and its stage's multiplier. An element past its vector only fills the word, and
        goes to the epilogues' scratch column."""
        plan = self.plan
        d, ways, layers = plan.model.d_model, plan.shape.ways, plan.model.n_layers
        qkv_matrices = [matrix_index(layer, Matrix.QKV) for layer in range(layers)]
        ways_bits = (ways - 1).bit_length()
        out = []
        for k in range(ways):
            # A product's word starts at a multiple of `ways` (MatVec's lanes are one): where that
            # is a power of two, its element k's column is a concatenation, not a carry chain.
            if ways == 1 << ways_bits:
                column = Cat(Const(k, ways_bits), product.column[ways_bits:])
            else:
                column = product.column + k
            if plan.qkv.table:  # QKV never comes: its stage only fills the table below
                qkv_stage, tag = Stage.Q, column
            else:
                qkv_stage = Mux(column < d, Stage.Q, Mux(column < 2 * d, Stage.K, Stage.V))
                qkv_column = Mux(column < d, column, Mux(column < 2 * d, column - d, column - 2 * d))
                qkv = product.matrix == Matrix.QKV if layers == 1 else product.matrix.matches(*qkv_matrices)
                tag = Mux(qkv, qkv_column, column)
            entries = []
            for layer in range(layers):
                first = len(Stage) * layer  # the layer's first select
                entries.append(first + qkv_stage if first else qkv_stage)
                entries += [first + step.sums_to for step in MATRICES[1:LAYER_MATRICES]]
            # HEAD's sums leave a group at once on `w`, never here: its entry only fills the table.
            stage_of = Array(entries + [Stage.F])
            out += [
                word[k].value.eq(product.acc[k]),
                word[k].select.eq(stage_of[product.matrix]),
                word[k].multiplier.eq(self.epilogues[k].first_multiplier(stage_of[product.matrix])),
                *([word[k].shift.eq(self.epilogues[k].first_shift(stage_of[product.matrix]))]
                  if plan.loadable else []),
                word[k].tag.eq(Mux(k >= product.count, plan.epilogue.scratch, tag)),
            ]
        return out

    def _probes(self, m):
        """Named copies of the streams out of the units, for benches to watch: in the generated
        Verilog a unit's own port names are not stable (they give way to its submodules')."""
        def probe(port, name):
            for field in ("valid", "ready", "payload"):
                copy = Signal.like(getattr(port, field), name=f"probe_{name}_{field}")
                m.d.comb += copy.eq(getattr(port, field))
        for k, epilogue in enumerate(self.epilogues):
            probe(epilogue.o, f"epilogue{k}")
        probe(self.attention.o, "attention")
        probe(self.matvec.o, "matvec")
        probe(self.matvec.w, "head")
        probe(self.attention.i, "query")
        probe(self.cache.write, "cache_write")
        if self.plan.lanes.hidden is not None:
            m.d.comb += [Signal(name="probe_hidden_valid").eq(self.matvec.hidden_valid),
                         Signal.like(self.matvec.hidden_vector, name="probe_hidden_payload").eq(
                             self.matvec.hidden_vector)]
