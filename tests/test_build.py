"""Building for the ULX3S: the fit check, the PLL, and a real bitstream with its report."""

import json
import subprocess
import sys

import numpy as np
import pytest

from boards.ulx3s import PARTS, pll_parameters
from hdl.build import FitError, check_fit, choose_ways, estimate, main, nextpnr_options
from hdl.engine import Engine, Shape
from int8model import load
from int8model.synthetic import random_model

SHIPPED = "models/zen32.json"


@pytest.mark.parametrize("hz", [25e6, 45e6, 50e6, 60e6, 100e6, 133e6])
def test_pll_settings_are_legal(hz):
    clki, clkfb, clkop, achieved = pll_parameters(hz)
    pfd = 25e6 / clki
    assert 3.125e6 <= pfd <= 400e6 and 400e6 <= achieved * clkop <= 800e6
    assert achieved == pfd * clkfb and abs(achieved - hz) / hz < 0.01


def test_a_model_too_large_for_the_part_is_refused_with_numbers(capsys):
    model = load(SHIPPED)
    with pytest.raises(FitError, match=r"multipliers: about \d+ MULT18X18D .* the LFE5U-25F has 28"):
        check_fit(model, 32, 1, "25F")
    assert check_fit(model, 33, 3, "85F")["MULT18X18D"] <= PARTS["85F"]["MULT18X18D"]
    with pytest.raises(FitError, match="the LFE5U-45F has 72"):
        check_fit(model, 33, 3, "45F")
    assert main(["--board", "ulx3s", "--device", "12F", "--model", SHIPPED, "--out", "build/never"]) == 2
    assert "does not fit the ULX3S-12F" in capsys.readouterr().err


def test_the_most_multipliers_the_part_fits_are_chosen_then_the_most_ways():
    """DSP blocks first, then one of a lane's multipliers in LUTs rather than fewer."""
    model = load(SHIPPED)
    # 32 lanes x 4 ways all in DSP blocks would take 32 x 4 + 32 + 4 heads x 2 rows + 1 + 8 = 177
    # of the 85F's 156.
    assert check_fit(model, 32, 4, "85F", lut_ways=1)["MULT18X18D"] == 32 * 3 + 32 + 8 + 1 + 8
    with pytest.raises(FitError, match=r"32 MAC lanes x 4 ways \+"):
        check_fit(model, 32, 4, "85F")
    assert choose_ways(model, "85F") == (4, 1, 32, True)
    assert choose_ways(model, "85F", ways=3) == (3, 0, 33, True)
    assert choose_ways(model, "85F", lanes=16) == (4, 0, 16, True)
    # The 45F's 72 take attention's 32 and the requants' beside 16 lanes of two ways, one in
    # LUTs: as many multipliers as 32 lanes of one way, a vector in half as many words.
    assert check_fit(model, 16, 2, "45F", lut_ways=1)["MULT18X18D"] == 16 + 32 + 8 + 1 + 4
    with pytest.raises(FitError, match="the LFE5U-45F has 72"):
        check_fit(model, 8, 4, "45F", lut_ways=1)
    assert choose_ways(model, "45F") == (2, 1, 16, True)
    with pytest.raises(FitError, match="the LFE5U-25F has 28"):
        choose_ways(model, "25F")


def test_more_cache_rows_a_cycle_take_their_banks_and_score_scales():
    """Each cache row read a cycle is a bank of the cache (8 DP16KD for the seed size) and a score
    scale per head (a DSP block): four rows fit the 85F beside its MAC lanes; on the 45F, they
    cost the q, k, v table its block RAM."""
    model = load(SHIPPED)
    two, four = (estimate(model, 32, 4, 1, attention_rows=rows) for rows in (2, 4))
    assert four["MULT18X18D"] - two["MULT18X18D"] == 2 * model.n_heads
    assert four["DP16KD"] - two["DP16KD"] == 2 * 2 * 8
    assert four["MULT18X18D"] <= PARTS["85F"]["MULT18X18D"] and four["DP16KD"] <= PARTS["85F"]["DP16KD"]
    assert choose_ways(model, "85F", attention_rows=4) == (4, 1, 32, True)
    assert choose_ways(model, "45F", attention_rows=4) == (2, 1, 16, False)
    with pytest.raises(FitError, match=r"\+ 16 score scales"):
        check_fit(model, 32, 4, "85F", attention_rows=4)
    with pytest.raises(ValueError, match="1, 2 or 4 cache rows"):
        Engine(model, attention_rows=3)


def test_cycles_are_counted_in_the_shape_the_part_is_built_with(capsys):
    """sim.cycles takes the build's shape for the part, the shape asked where it is whole, and
    refuses a part the model does not fit, with the build's reason."""
    from sim.cycles import main as cycles_main, shape_for
    model = load(SHIPPED)
    assert shape_for(model) == Shape(32, 4, 1, True)
    assert shape_for(model, "45F") == Shape(16, 2, 1, True)
    assert shape_for(model, "45F", ways=3) == Shape(9, 3, 1, True)  # 18 x 3 takes too many multipliers
    assert shape_for(model, "12F", ways=8, lanes=64, qkv_table=False) == Shape(64, 8, 0, False)
    assert shape_for(model, attention_rows=4, hidden_in_lanes=True) == Shape(32, 4, 1, True, True, 4)
    with pytest.raises(SystemExit) as refused:
        cycles_main(["--device", "25F"])
    assert refused.value.code == 2
    assert "does not fit the ULX3S-25F" in capsys.readouterr().err


def test_the_qkv_table_where_the_part_has_the_block_ram():
    """A model whose q, k, v table is small enough (120 KB) gets it on the 85F, not on the 45F:
    there the table's 86 block RAMs and the rest's 62 exceed its 108."""
    model = random_model(np.random.default_rng(1), 32, 4, 32, 40, 32)
    assert estimate(model, 32, 1, 1)["DP16KD"] > 108 >= estimate(model, 32, 1, 1, qkv_table=False)["DP16KD"]
    assert choose_ways(model, "85F") == (4, 1, 32, True)
    assert choose_ways(model, "45F") == (2, 1, 16, False)
    assert choose_ways(load(SHIPPED), "85F", qkv_table=False) == (4, 1, 32, False)


def test_the_placement_seed_reaches_nextpnr():
    assert "--seed" not in nextpnr_options()
    assert nextpnr_options(7).split()[-2:] == ["--seed", "7"]


@pytest.mark.slow
def test_bitstream_for_the_shipped_model(tmp_path):
    model = load(SHIPPED)
    result = subprocess.run([sys.executable, "-m", "hdl.build", "--board", "ulx3s", "--device", "85F",
                             "--model", SHIPPED, "--out", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["identity"] == model.identity_line
    assert report["timing_met"] and report["fmax_mhz"] * 1e6 >= report["clock_hz"]
    # nextpnr's fmax is its critical path's delay; the path runs through the design's own lines.
    assert report["critical_path"]["delay_ns"] == pytest.approx(1000 / report["fmax_mhz"], rel=0.05)
    assert all(line.startswith(("hdl/", "boards/")) for line in report["critical_path"]["sources"])
    assert report["utilisation"]["DP16KD"]["available"] == PARTS["85F"]["DP16KD"]
    assert report["utilisation"]["MULT18X18D"]["used"] > 0
    assert len(report["cycles_per_token"]["per_position"]) == model.seq_len
    assert (tmp_path / "top.bit").stat().st_size > 100_000
    assert model.identity_line in (tmp_path / "report.txt").read_text()


def test_units_are_costed_as_elaborated_for_the_ecp5(tmp_path):
    """``hdl.cost`` synthesises a unit as the board build elaborates it: the MAC lanes'
    multipliers take their operands in their own input registers, not in fabric registers. It
    places the unit out of context, where the lanes' enables cannot go on global networks."""
    from hdl.cost import synthesise
    from hdl.matvec import MatVec
    matrices = [np.random.default_rng(3).integers(-128, 128, size=(8, 4))]
    resources = synthesise(MatVec(matrices, 4, ways=2), "lanes", tmp_path)
    assert resources["fmax"] > 0
    cells = json.loads((tmp_path / "lanes.json").read_text())["modules"]["lanes"]["cells"].values()
    multipliers = [cell["parameters"] for cell in cells if cell["type"] == "MULT18X18D"]
    assert resources["MULT18X18D"] == len(multipliers) == 8
    assert all(p["REG_INPUTA_CLK"] == p["REG_INPUTB_CLK"] == "CLK0" for p in multipliers)


def test_a_shape_resolves_its_defaults_for_the_model():
    model = load(SHIPPED)
    assert Shape().resolved(model) == Shape(32, 4, 0, True)
    assert Shape(ways=3, qkv_table=False).resolved(model) == Shape(33, 3, 0, False)
    wide = random_model(np.random.default_rng(1), 32, 4, 32, 64, 32)  # a 192 KB table: too large
    assert Shape().resolved(wide).qkv_table is False


def test_the_benchmark_reads_the_shape_a_report_records():
    """``hdl.build`` writes the shape's fields into its report; ``bench.speed`` counts the cycles
    of that shape, and of a report older than a field, that field's default."""
    import dataclasses
    from bench.speed import report_shape
    built = Shape(16, 2, 1, True, True, 4)
    assert report_shape({"identity": "model sha256 0", "fmax_mhz": 90.0, **dataclasses.asdict(built)}) == built
    assert report_shape({"lanes": 32, "ways": 4, "lut_ways": 1, "qkv_table": True}) == Shape(32, 4, 1, True)


def test_the_benchmark_takes_a_random_models_own_build(tmp_path):
    """``bench.speed --write-models`` writes the benchmark's random models as files (to build),
    and a random model's row takes the fmax of the report built from its file, else the
    shipped model's."""
    from bench.speed import benchmark_models, fmax_for, main as speed_main
    assert speed_main(["--write-models", str(tmp_path)]) == 0
    shipped = load(SHIPPED)
    models = benchmark_models(shipped, "shipped")
    written = sorted(tmp_path.glob("*.json"))
    assert [load(path).sha256 for path in written] == [model.sha256 for model in list(models.values())[1:]]
    first, second = list(models.values())[1:]
    reports = [{"model_sha256": shipped.sha256, "fmax_mhz": 100.0}, {"model_sha256": first.sha256, "fmax_mhz": 90.0}]
    assert fmax_for(first, reports, 100.0) == (90.0, reports[1])
    assert fmax_for(second, reports, 100.0) == (100.0, None)
