"""CPU figures, timed as the benchmark's tables print them."""

from int8model import Golden

from .c_decoder import CDecoder

__all__ = ["TIMING_RUNS", "c_ns_per_token"]

# A CPU figure is the fastest of a few runs (for the C decoder, of every repetition of a whole
# context in them): another process sharing the core only ever slows a run down (one such run,
# beside a simulation, once took eight times as long; a run's mean, on an idle virtual machine,
# still varied by half from one benchmark to the next).
TIMING_RUNS = 5


def c_ns_per_token(model, prompt, qkv_table=False, repetitions=2000):
    """The C decoder's nanoseconds a token: the fastest of ``TIMING_RUNS`` runs of
    ``repetitions`` whole contexts from ``prompt``, its tokens held against the golden model's."""
    decoder = CDecoder(model, qkv_table=qkv_table)
    try:
        runs = [decoder.run(prompt, repetitions=repetitions) for _ in range(TIMING_RUNS)]
    finally:
        decoder.close()
    want = [t.next for t in Golden(model).generate(prompt, model.seq_len - len(prompt) + 1)]
    if any(tokens != want for tokens, _ in runs):
        raise AssertionError("the C decoder disagrees with the golden model")
    return min(ns for _, ns in runs)
