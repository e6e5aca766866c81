"""What ``sim.runner`` promises a bench, checked inside the simulator."""

import sys

import cocotb


@cocotb.test()
async def only_the_benches_asserts_are_rewritten(dut):
    # A module whose asserts pytest rewrote imports its helpers as ``@py_builtins``.
    import amaranth.hdl._ir  # noqa: F401  (asserts of its own)
    import numpy._core.numeric  # noqa: F401
    assert "@py_builtins" in globals(), "the bench's own asserts would fail without their values"
    rewritten = [name for name in ("amaranth.hdl._ir", "numpy._core.numeric")
                 if "@py_builtins" in vars(sys.modules[name])]
    assert not rewritten, f"rewritten on import: {rewritten}"
