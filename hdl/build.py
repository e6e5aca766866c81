"""``python -m hdl.build``: the build's entry point, where users find it (the flow is :mod:`flows.build`)."""

import sys

from flows.build import main

if __name__ == "__main__":
    sys.exit(main())
