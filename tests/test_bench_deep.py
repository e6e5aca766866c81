"""The deep models' benchmark rows: which models, and that each has an 85F plan."""

from bench.deep import deep_models
from int8model import load
from plan import choose_plan


def test_the_deep_rows_are_the_demo_and_random_models_of_its_shape():
    demo = load("models/kjv4.json")
    models = deep_models(demo)
    assert list(models.values())[0] is demo
    assert sorted(model.n_layers for model in list(models.values())[1:]) == [1, 2, 4]
    for model in models.values():
        assert (model.d_model, model.n_heads, model.d_ff, model.vocab, model.seq_len) == \
            (64, demo.n_heads, demo.d_ff, demo.vocab, demo.seq_len)
        assert not choose_plan(model, "85F").qkv.table or model.n_layers == 1
