"""Proofs (SymbiYosys, Yices) that the requant units, the floor divider and the arg-max equal
their specification for every input, and that a proof fails where the specification is wrong."""

import pytest

from plan.arithmetic import Rule
from plan.requant import divider_plan
from plan.units import argmax_plan
from int8model.bounds import Bound
from sim.formal import ArgMaxProof, DividerProof, Proof, RequantProof, proofs_for, run_proof

PROOFS = {proof.name: proof for proof in proofs_for()}
# Each of these takes minutes of the solver: `python -m sim.formal` runs them (see docs/verification.md).
LONG = {"zen32 attention divider", "zen32 arg-max"}


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in PROOFS if name not in LONG])
def test_the_unit_equals_its_specification(name, tmp_path):
    status, seconds = run_proof(PROOFS[name], timeout=600, workdir=tmp_path)
    assert status == "proved", f"{name}: {status} after {seconds:.0f} s"


def test_a_unit_held_to_a_wrong_specification_fails(tmp_path):
    """The harness is strict: each unit against a specification one step off is refuted."""
    requant = PROOFS["zen32 epilogue last requant rule 0"]
    plan = requant.harness().plan
    rule = plan.rules[0]
    off = [
        Proof("requant, multiplier one more", lambda: RequantProof(plan, 0, specification=Rule(
            rule.multiplier + 1, rule.shift, rule.relu, rule.saturate)), requant.depth, ""),
        Proof("divider, rounding up", lambda: DividerProof(divider_plan(
            Bound(-200, 200), Bound(1, 9), Bound(-30, 30)), rounding="ceiling"), 6, ""),
        Proof("arg-max, ties to the last", lambda: ArgMaxProof(argmax_plan(6, 8, 4), ties="last"), 6, ""),
    ]
    for proof in off:
        assert run_proof(proof, timeout=300, workdir=tmp_path / str(off.index(proof)))[0] == "failed", proof.name


def test_a_proof_out_of_time_says_so(tmp_path):
    proof = PROOFS["zen32 epilogue first requant rule 6"]
    assert run_proof(proof, timeout=0.5, workdir=tmp_path)[0] == "timeout"
