"""The epilogue between two products: its stages' latency, and their results against the golden model."""

import pytest

from hdl.epilogue import Epilogue
from int8model import load
from int8model.format import from_json
from int8model.golden import c8, rq
from plan import Stage, make_plan
from sim.latency import one_item

SHIPPED = "models/zen32.json"


def with_requant(model, **pairs):
    doc = model.to_json()
    doc["requant"].update({name: list(pair) for name, pair in pairs.items()})
    return from_json(doc)


@pytest.mark.parametrize("r_hid, cycles", [((1, 3), 3), ((4, 5), 3), ((1, 0), 3), ((3, 3), 6), ((8, 2), 3),
                                           ((7448, 13), 3), ((-3, 1), 3)])
@pytest.mark.parametrize("acc", [123456, 1234, -98765, 0])
def test_hidden_stage(r_hid, cycles, acc):
    """``fi = to8(max(0, rq(acc, M_h)), r_hid)``: where r_hid multiplies by 2^k and shifts by at
    least k (the shipped model's (1, 3)), the two requants are one, and the value leaves after
    it, three cycles sooner; so it does where r_hid's results on the ReLU's range (0..5292 here)
    take at most 256 entries, which the first requant looks up in a table of them; else
    (3, 3), whose results change up to 339, the last requant."""
    model = with_requant(load(SHIPPED), r_hid=r_hid)
    plan = make_plan(model).epilogue
    unit = Epilogue(plan)
    assert plan.latency(Stage.H) == cycles
    seen = one_item(unit, {"value": acc, "tag": 5, "select": Stage.H,
                           "multiplier": plan.first.rules[Stage.H].multiplier},
                    read=lambda ctx: (ctx.get(unit.o.payload.value), ctx.get(unit.o.payload.tag)))
    hidden = max(int(rq(acc, model.requant["M_h"])), 0)
    want = int(c8(rq(hidden, model.requant["r_hid"])))
    assert seen == [(cycles, (want, 5))]
