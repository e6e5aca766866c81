#!/usr/bin/env bash
# Set up everything this project needs on a Debian machine, then run the demo generation.
#   ./setup.sh            set up, then generate with the shipped model
#   ./setup.sh --no-demo  set up only
set -euo pipefail
cd "$(dirname "$0")"

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v iverilog >/dev/null || missing+=(iverilog)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    as_root apt-get update -qq
    as_root apt-get install -y -qq "${missing[@]}"
fi
# openFPGALoader only programs a board: a machine without it still builds and tests everything.
if ! command -v openFPGALoader >/dev/null; then
    echo "setup: installing openfpgaloader"
    { [ ${#missing[@]} -gt 0 ] || as_root apt-get update -qq; } && as_root apt-get install -y -qq openfpgaloader \
        || echo "setup: openfpgaloader is not available; boards can be built but not programmed"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .

if [ "${1:-}" != "--no-demo" ]; then
    .venv/bin/python -m host.generate --text "beautiful is"
fi
