"""A straightforward, loop-by-loop reading of docs/semantics.md in Python integers.

Written apart from the golden model (no NumPy, no shared helpers) so that the two can be held
against each other.
"""


def rq(x, pair):
    m, s = pair
    return (x * m) >> s  # Python ints: exact, and >> floors toward −∞


def c8(x):
    return -128 if x < -128 else 127 if x > 127 else x


SHARED = ("r_out", "Eq")


class Reference:
    """Reads a model file as docs/semantics.md writes it, a deep one (``n_layers``, a list per
    per-layer key) as L layers of the one-layer step."""

    def __init__(self, doc):
        cfg = doc["config"]
        self.d, self.h, self.dff = cfg["d_model"], cfg["n_heads"], cfg["d_ff"]
        self.vocab, self.ctx = cfg["vocab"], cfg["seq_len"]
        self.layers = cfg.get("n_layers")
        self.ein, self.pin = doc["embed_stream"]["EinA"], doc["embed_stream"]["PinA"]
        self.lut = doc["exp_lut"]
        self.doc = doc
        self.caches = [([], []) for _ in range(self.layers or 1)]
        self.events = set()  # which edge cases this run went through
        self.use_layer(0)

    def use_layer(self, layer):
        """Read the pairs and the matrices of ``layer`` (the shared ones, and all of a one-layer file)."""
        def value(section, key):
            v = self.doc[section][key]
            return v[layer] if self.layers is not None and key not in SHARED else v
        self.r = {k: tuple(value("requant", k)) for k in self.doc["requant"]}
        self.w = {k: value("weights_int8", k) for k in self.doc["weights_int8"]}
        self.kc, self.vc = self.caches[layer]

    def to8(self, x, key):
        y = rq(x, self.r[key])
        if y > 127:
            self.events.add("saturate_high")
        if y < -128:
            self.events.add("saturate_low")
        return c8(y)

    def mv(self, vec, name, cols):
        w = self.w[name]
        return [sum(vec[e] * w[e * cols + j] for e in range(len(vec))) for j in range(cols)]

    def step(self, tok, pos):
        d = self.d
        x = [self.ein[tok * d + e] + self.pin[pos * d + e] for e in range(d)]
        for layer in range(self.layers or 1):
            self.use_layer(layer)
            x = self.layer(x, pos)
        oi = [self.to8(v, "r_out") for v in x]
        logits = [sum(oi[e] * self.w["Eq"][t * d + e] for e in range(d)) for t in range(self.vocab)]
        best = 0
        for t in range(1, self.vocab):
            if logits[t] > logits[best]:
                best = t
        if logits.count(logits[best]) > 1:
            self.events.add("argmax_tie")
        return logits, best

    def layer(self, x, pos):
        """One layer of the step: its residual stream in, the next one out."""
        d, hd = self.d, self.d // self.h
        xi = [self.to8(v, "r_qkv") for v in x]
        q = [self.to8(v, "M_q") for v in self.mv(xi, "Wq", d)]
        k = [self.to8(v, "M_k") for v in self.mv(xi, "Wk", d)]
        v = [self.to8(v, "M_v") for v in self.mv(xi, "Wv", d)]
        self.kc.append(k)
        self.vc.append(v)
        ci = [0] * d
        for g in range(self.h):
            cols = range(g * hd, g * hd + hd)
            s = [sum(q[e] * self.kc[j][e] for e in cols) for j in range(pos + 1)]
            m = max(s)
            w = []
            for sj in s:
                idx = rq(m - sj, self.r["M_score"])
                if idx > len(self.lut) - 1:
                    self.events.add("lut_beyond_end")
                w.append(self.lut[min(max(idx, 0), len(self.lut) - 1)])
            den = sum(w)
            for e in cols:
                num = sum(w[j] * self.vc[j][e] for j in range(pos + 1))
                if num < 0 and num % den:
                    self.events.add("negative_inexact_division")
                ci[e] = self.to8(num // den, "r_ctx")
        o = self.mv(ci, "Wo", d)
        s1 = [x[e] + rq(o[e], self.r["M_o"]) for e in range(d)]
        hi = [self.to8(v, "r_ffn") for v in s1]
        fi = [self.to8(max(0, rq(a, self.r["M_h"])), "r_hid") for a in self.mv(hi, "W1", self.dff)]
        f = self.mv(fi, "W2", d)
        return [s1[e] + rq(f[e], self.r["M_f"]) for e in range(d)]
