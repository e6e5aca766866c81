"""The decode step in C, generated from a model file and built with the system C compiler.

A fair CPU baseline: the tables are compile-time constants, int64 arithmetic as in the
reference, one core. Its tokens are checked against the golden model before it is timed.
With ``qkv_table``, it reads q, K[pos] and V[pos] from a table of every token and position
(int8), as the engine does where that table is small: the same shortcut on both sides.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["c_source", "CDecoder"]

TEMPLATE = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define D {d}
#define H {h}
#define HD {hd}
#define DFF {dff}
#define V {v}
#define C {c}
#define L {layers}
#define NLUT {nlut}

{tables}

static inline int64_t rq(int64_t x, int64_t m, int s) {{ return (x * m) >> s; }}
static inline int64_t c8(int64_t x) {{ return x < -128 ? -128 : (x > 127 ? 127 : x); }}
static inline int64_t fdiv(int64_t a, int64_t b) {{ int64_t q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q; }}
#define RQ(x, key) rq((x), key##_M[l], key##_S[l])

static int64_t K[L][C][D], Vc[L][C][D];

/* One layer: its residual stream in x, the next one out in x. */
static void layer(int l, int64_t *x, int tok, int pos) {{
    int64_t q[D], ci[D], s1[D], hi[D], fi[DFF], acc;
{projections}
    for (int g = 0; g < H; g++) {{
        int64_t s[C], w[C], m = 0, den = 0;
        for (int j = 0; j <= pos; j++) {{
            acc = 0;
            for (int e = g * HD; e < g * HD + HD; e++) acc += q[e] * K[l][j][e];
            s[j] = acc; if (j == 0 || acc > m) m = acc;
        }}
        for (int j = 0; j <= pos; j++) {{
            int64_t idx = RQ(m - s[j], M_SCORE); idx = idx < 0 ? 0 : (idx > NLUT - 1 ? NLUT - 1 : idx);
            w[j] = E[idx]; den += w[j];
        }}
        for (int e = g * HD; e < g * HD + HD; e++) {{
            int64_t num = 0;
            for (int j = 0; j <= pos; j++) num += w[j] * Vc[l][j][e];
            ci[e] = c8(RQ(fdiv(num, den), R_CTX));
        }}
    }}
    for (int j = 0; j < D; j++) {{
        acc = 0; for (int e = 0; e < D; e++) acc += ci[e] * Wo[l][e * D + j];
        s1[j] = x[j] + RQ(acc, M_O); hi[j] = c8(RQ(s1[j], R_FFN));
    }}
    for (int j = 0; j < DFF; j++) {{
        acc = 0; for (int e = 0; e < D; e++) acc += hi[e] * W1[l][e * DFF + j];
        int64_t r = RQ(acc, M_H); fi[j] = c8(RQ(r < 0 ? 0 : r, R_HID));
    }}
    for (int j = 0; j < D; j++) {{
        acc = 0; for (int e = 0; e < DFF; e++) acc += fi[e] * W2[l][e * D + j];
        x[j] = s1[j] + RQ(acc, M_F);
    }}
}}

static int step(int tok, int pos) {{
    int64_t x[D], oi[D], acc;
    for (int e = 0; e < D; e++) x[e] = EinA[tok * D + e] + PinA[pos * D + e];
    for (int l = 0; l < L; l++) layer(l, x, tok, pos);
    for (int e = 0; e < D; e++) oi[e] = c8(rq(x[e], R_OUT_M, R_OUT_S));
    int best = 0; int64_t top = 0;
    for (int t = 0; t < V; t++) {{
        acc = 0; for (int e = 0; e < D; e++) acc += oi[e] * Eq[t * D + e];
        if (t == 0 || acc > top) {{ top = acc; best = t; }}
    }}
    return best;
}}

/* argv: repetitions, then the prompt's tokens; generates to the end of the context, that many
   times, and reports the fastest: a repetition that shares the core with another process (or,
   on a virtual machine, loses it for a while) only ever takes longer. */
int main(int argc, char **argv) {{
    int reps = atoi(argv[1]), n = argc - 2, out[C];
    int prompt[C];
    for (int i = 0; i < n; i++) prompt[i] = atoi(argv[2 + i]);
    int total = C, generated = C - n + 1;
    double fastest = -1;
    for (int r = 0; r < reps; r++) {{
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int tok = prompt[0];
        for (int pos = 0; pos < total; pos++) {{
            int next = step(tok, pos);
            if (pos >= n - 1) out[pos - n + 1] = next;
            tok = pos + 1 < n ? prompt[pos + 1] : next;
        }}
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
        if (fastest < 0 || ns < fastest) fastest = ns;
    }}
    for (int i = 0; i < generated; i++) printf("GEN %d %d\n", i, out[i]);
    printf("NS_PER_TOKEN %.3f\n", fastest / total);
    return 0;
}}
"""


def _table(name, values, ctype="int64_t"):
    values = [int(v) for v in values]
    return f"static const {ctype} {name}[{max(1, len(values))}] = {{{','.join(map(str, values))}}};"


def _layer_table(name, arrays):
    rows = ["{" + ",".join(str(int(v)) for v in array.ravel()) + "}" for array in arrays]
    return f"static const int64_t {name}[L][{arrays[0].size}] = {{{','.join(rows)}}};"


COMPUTED = r"""
    int64_t xi[D];
    for (int e = 0; e < D; e++) xi[e] = c8(RQ(x[e], R_QKV));
    for (int j = 0; j < D; j++) {
        int64_t a = 0, b = 0, c = 0;
        for (int e = 0; e < D; e++) { a += xi[e] * Wq[l][e * D + j]; b += xi[e] * Wk[l][e * D + j]; c += xi[e] * Wv[l][e * D + j]; }
        q[j] = c8(RQ(a, M_Q)); K[l][pos][j] = c8(RQ(b, M_K)); Vc[l][pos][j] = c8(RQ(c, M_V));
    }"""

FROM_TABLE = r"""
    const int8_t *row = QKV[tok * C + pos];
    for (int j = 0; j < D; j++) { q[j] = row[j]; K[l][pos][j] = row[D + j]; Vc[l][pos][j] = row[2 * D + j]; }"""


def _qkv_table(model):
    from int8model.golden import projections
    rows = []
    for tok in range(model.vocab):
        for pos in range(model.seq_len):
            _, _, q, k, v = projections(model, tok, pos)
            rows.append("{" + ",".join(str(int(value)) for value in (*q, *k, *v)) + "}")
    return f"static const int8_t QKV[V * C][3 * D] = {{{','.join(rows)}}};"


def c_source(model, qkv_table=False):
    """The C decoder of ``model`` (every layer's); with ``qkv_table``, a one-layer model's q, k
    and v from a table of every token and position."""
    if qkv_table and model.n_layers != 1:
        raise ValueError("the q, k, v table holds a one-layer model's q, k and v")
    layers = model.layers
    tables = [_layer_table(key, [layer.weights[key] for layer in layers])
              for key in ("Wq", "Wk", "Wv", "Wo", "W1", "W2")]
    tables += [_table("Eq", model.head.ravel()), _table("EinA", model.embed.ravel()),
               _table("PinA", model.positions.ravel()), _table("E", model.exp_lut)]
    for key in ("r_qkv", "r_ffn", "r_ctx", "r_hid", "M_q", "M_k", "M_v", "M_o", "M_h", "M_f", "M_score"):
        tables.append(_table(f"{key.upper()}_M", [layer.requant[key][0] for layer in layers]))
        tables.append(_table(f"{key.upper()}_S", [layer.requant[key][1] for layer in layers], "int"))
    tables.append(f"#define R_OUT_M {model.r_out[0]}LL\n#define R_OUT_S {model.r_out[1]}")
    if qkv_table:
        tables.append(_qkv_table(model))
    return TEMPLATE.format(d=model.d_model, h=model.n_heads, hd=model.head_dim, dff=model.d_ff,
                           v=model.vocab, c=model.seq_len, layers=model.n_layers, nlut=model.nlut,
                           tables="\n".join(tables), projections=FROM_TABLE if qkv_table else COMPUTED)


class CDecoder:
    """The compiled decoder of one model."""

    def __init__(self, model, compiler=None, qkv_table=False):
        self.model = model
        compiler = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise RuntimeError("no C compiler found (set CC)")
        self.workdir = Path(tempfile.mkdtemp(prefix="cdecoder_"))
        source = self.workdir / "decoder.c"
        source.write_text(c_source(model, qkv_table))
        self.binary = self.workdir / "decoder"
        subprocess.run([compiler, "-O2", "-march=native", "-o", str(self.binary), str(source)], check=True)

    def run(self, prompt, repetitions=1):
        """Generate to the end of the context ``repetitions`` times; returns ``(tokens,
        ns_per_step)``, the time that of the fastest repetition."""
        result = subprocess.run([str(self.binary), str(repetitions), *map(str, prompt)],
                                capture_output=True, text=True, check=True)
        tokens, ns = [], None
        for line in result.stdout.splitlines():
            if line.startswith("GEN "):
                tokens.append(int(line.split()[2]))
            elif line.startswith("NS_PER_TOKEN "):
                ns = float(line.split()[1])
        return tokens, ns

    def close(self):
        shutil.rmtree(self.workdir, ignore_errors=True)
