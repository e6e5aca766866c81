"""Generate tokens with a model: python -m host.generate --model models/zen32.json --text "..."

Prints one ``GEN i token`` line per generated token (the reference trace format), or with
``--text`` the prompt and its continuation, decoded by the model's tokenizer; either as each
token arrives.
"""

import argparse
import sys

from int8model.format import ModelError, load
from int8model.golden import DecodeError, check_generation
from int8model.train import Tokenizer

from plan.options import add_model_argument, add_shape_arguments, asked_shape

from .backends import BACKENDS, default_backend, open_backend
from .device import DeviceError, IdentityMismatch, NotLoadable


def parse_prompt(text):
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of token ids") from None


def show_progress(done, total):
    width = 30
    filled = width * done // max(1, total)
    print(f"\rloading the model [{'#' * filled}{'.' * (width - filled)}] {done:,} / {total:,} bytes", end="",
          file=sys.stderr, flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m host.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(BACKENDS),
                        help="where the decode steps run: the NumPy golden model, the simulated "
                             "board, or the board (default: the board if one is attached, else sim)")
    add_model_argument(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", type=parse_prompt,
                        help="prompt token ids, e.g. 3,1,4 (this or --text is required)")
    source.add_argument("--text", help="prompt text, encoded with the model's tokenizer (this or --prompt is required)")
    parser.add_argument("--generate", type=int, metavar="N",
                        help="tokens to generate (default: up to the end of the context)")
    parser.add_argument("--port", help="serial port of the board (serial backend; default: the attached ULX3S)")
    parser.add_argument("--load", action="store_true",
                        help="upload the model into a loadable build first, unless it holds it already (with "
                             "--backend sim: the simulated board is built for the model's shape with no model "
                             "in it, and the model travels over its serial line; default: off)")
    add_shape_arguments(parser, device_help="the simulated board is built as this part's build would be (sim backend)")
    args = parser.parse_args(argv)

    try:
        model = load(args.model)
        if args.text is not None:
            if model.tokenizer is None:
                raise ModelError(f"{args.model} has no tokenizer; give --prompt token ids instead")
            tokenizer = Tokenizer(model.tokenizer)
            prompt = tokenizer.encode(args.text.lower())
        else:
            prompt = args.prompt
        count = args.generate if args.generate is not None else model.seq_len - len(prompt) + 1
        check_generation(model, prompt, count)
        print(model.identity_line, file=sys.stderr)
        backend_name = args.backend or default_backend()
        backend = open_backend(backend_name, model, port=args.port, model_path=args.model,
                               shape=asked_shape(args), device=args.device, load=args.load,
                               loadable=args.loadable, progress=show_progress)
        if getattr(backend, "upload", None):
            sent, seconds = backend.upload
            print(f"\nloaded {sent:,} bytes of memory images in {seconds:.2f} s", file=sys.stderr)
        try:
            # Each token is shown as it arrives: the simulated board makes the deep demo's a few
            # a second, and a failure part-way keeps what came before it.
            if args.text is not None:
                print(args.text.lower(), end="", flush=True)
            for i, tok in enumerate(backend.generate(prompt, count)):
                if args.text is None:
                    print(f"GEN {i} {tok}", flush=True)
                else:
                    print(tokenizer.decode([tok]), end="", flush=True)
        finally:
            if args.text is not None:
                print(flush=True)
            backend.close()
    except (ModelError, DecodeError, DeviceError, IdentityMismatch, NotLoadable, ValueError, OSError,
            TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
