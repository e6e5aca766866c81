"""Train a deep demo model on a real corpus: python -m int8model.train_deep --out models/kjv4.json

A character model of the King James Bible (Debian's bible-kjv-text, installed where missing),
trained in float with JAX (the optional extra: pip install -e .[train]), quantised with scales
calibrated on the training text, and judged on held-out chapters it never saw: teacher-forced
next-character accuracy and bits per character, float and int8, beside a one-layer model trained
the same way. The figures go into the model file (its "training" key) and are printed.
"""

import argparse
import json
import sys
import time

import numpy as np

from .corpus import kjv
from .float_twin import float_figures, forward, init_params, int8_figures, int8_model, quantise, windows
from .train import Tokenizer

__all__ = ["train", "main"]


def _jax():
    try:
        import jax
        import jax.numpy as jnp
        import optax
    except ImportError:
        raise SystemExit("error: training needs JAX and optax: pip install -e .[train]") from None
    return jax, jnp, optax


def train(ids, config, *, steps, batch, learning_rate, seed, log=print):
    """Float parameters (NumPy) trained with AdamW on random windows of ``ids``."""
    jax, jnp, optax = _jax()
    rng = np.random.default_rng(seed)
    params = jax.tree_util.tree_map(jnp.asarray, init_params(rng, **config))
    n_heads, seq_len = config["n_heads"], config["seq_len"]
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, min(500, steps // 10), steps,
                                                  learning_rate / 20)
    optimiser = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
    state = optimiser.init(params)

    def loss(p, tokens):
        logits = forward(p, tokens[:, :-1], n_heads, xp=jnp)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def update(p, s, tokens):
        value, grads = jax.value_and_grad(loss)(p, tokens)
        changes, s = optimiser.update(grads, s, p)
        return optax.apply_updates(p, changes), s, value

    ids = np.asarray(ids)
    started = time.monotonic()
    for step in range(1, steps + 1):
        starts = rng.integers(0, len(ids) - seq_len - 1, size=batch)
        tokens = np.stack([ids[s:s + seq_len + 1] for s in starts])
        params, state, value = update(params, state, tokens)
        if step % 500 == 0 or step == 1:
            log(f"  step {step:6d}/{steps}  loss {float(value):.3f} nats  ({time.monotonic() - started:.0f} s)")
    return jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float64), params)


def build(corpus, tokenizer, config, *, steps, batch, learning_rate, seed, held_out_chars, log=print):
    """Train, quantise and judge one model; return its model file (a dict, figures included)."""
    ids = tokenizer.encode(corpus.train)
    log(f"training {config['layers']} layer(s) of d_model {config['d_model']} on {len(ids):,} characters")
    params = train(ids, config, steps=steps, batch=batch, learning_rate=learning_rate, seed=seed, log=log)
    calibration = [x for x, _ in windows(ids[:200 * config["seq_len"]], config["seq_len"])]
    doc = quantise(params, config["n_heads"], calibration, tokenizer)
    model = int8_model(doc)
    held_out = tokenizer.encode(corpus.held_out[:held_out_chars])
    log("judging on the held-out chapters")
    figures = {"float": float_figures(params, config["n_heads"], held_out, config["seq_len"]),
               "int8": int8_figures(model, held_out, doc["logit_scale"])}
    doc["training"] = {"corpus": "King James Bible (bible-kjv-text), held-out chapters", "steps": steps,
                       "seed": seed, "held_out": figures}
    return doc, figures


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m int8model.train_deep", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the int8 model file (required)")
    parser.add_argument("--layers", type=int, default=4, help="layers (default: %(default)s)")
    parser.add_argument("--d-model", type=int, default=64, help="the residual stream's width (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default: %(default)s)")
    parser.add_argument("--d-ff", type=int, default=128, help="the FFN's hidden width (default: %(default)s)")
    parser.add_argument("--seq-len", type=int, default=128, help="positions of the context (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=8000, help="training steps (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="windows a step (default: %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=3e-3, help="AdamW's peak rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and batches (default: %(default)s)")
    parser.add_argument("--held-out-chars", type=int, default=60_000,
                        help="characters of the held-out chapters judged on (default: %(default)s)")
    parser.add_argument("--baseline-out",
                        help="also train a one-layer model the same way, and write it here (default: no baseline)")
    args = parser.parse_args(argv)
    corpus = kjv()
    tokenizer = Tokenizer(corpus.chars)
    options = dict(steps=args.steps, batch=args.batch, learning_rate=args.learning_rate, seed=args.seed,
                   held_out_chars=args.held_out_chars, log=lambda line: print(line, file=sys.stderr, flush=True))
    config = dict(layers=args.layers, d_model=args.d_model, n_heads=args.heads, d_ff=args.d_ff,
                  vocab=len(tokenizer.chars), seq_len=args.seq_len)
    rows = []
    if args.baseline_out:
        doc, figures = build(corpus, tokenizer, dict(config, layers=1), **options)
        with open(args.baseline_out, "w") as out:
            json.dump(doc, out, separators=(",", ":"))
        rows.append(("1 layer (baseline)", figures))
    doc, figures = build(corpus, tokenizer, config, **options)
    if args.baseline_out:
        doc["training"]["baseline"] = rows[0][1]
    with open(args.out, "w") as out:
        json.dump(doc, out, separators=(",", ":"))
    rows.append((f"{args.layers} layers", figures))
    print(f"held-out text: {figures['float']['characters']:,} characters of chapters never trained on")
    print(f"{'model':20s} {'float acc':>9s} {'int8 acc':>9s} {'float bpc':>9s} {'int8 bpc':>9s}")
    for label, f in rows:
        print(f"{label:20s} {f['float']['accuracy']:9.1%} {f['int8']['accuracy']:9.1%} "
              f"{f['float']['bits_per_char']:9.3f} {f['int8']['bits_per_char']:9.3f}")
    print(int8_model(doc).identity_line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
