"""docs/conventions.md: its keras-hub table says what keras-hub's models compute,
and its other tables are the ones docs/figures/conventions.json gives.

Each family's row is checked against a tiny model of that family built now
(seconds), so the page cannot drift from the installed keras-hub: a changed
scale, tie, logit scale or soft cap, or a cited line that moved, fails here.
The full experiment takes minutes (`python docs/experiments/conventions.py`);
its `--quick` run is in the slow tier.
"""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "experiments" / "conventions.py"
PAGE = ROOT / "docs" / "conventions.md"

pytestmark = pytest.mark.tensorflow_only  # the script sets TensorFlow's thread pools


@pytest.fixture(scope="module")
def conventions():
    return load_script(SCRIPT.relative_to(ROOT), "conventions")


@pytest.fixture(scope="module")
def results(conventions):
    return json.loads(conventions.RESULTS.read_text())


def declared_factor(text: str, width: int) -> float:
    return {"1": 1.0, "sqrt(d)": math.sqrt(width), "d^-0.5": width**-0.5}[text]


FAMILY_NAMES = [
    "GPT-2",
    "BERT",
    "T5 (v1.0)",
    "Gemma",
    "Gemma 2",
    "Gemma 3",
    "Llama",
    "Mistral",
    "Qwen 2",
]


def test_every_family_is_checked(conventions):
    assert [family.name for family in conventions.FAMILIES] == FAMILY_NAMES


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_family_row_is_what_keras_hub_computes(conventions, results, name):
    import keras_hub

    family = next(family for family in conventions.FAMILIES if family.name == name)
    assert keras_hub.__version__ == conventions.KERAS_HUB_VERSION, (
        "keras-hub changed: rerun docs/experiments/conventions.py and check the citations"
    )
    for citation in family.citations:
        line = conventions.cited_line(citation)
        assert citation.text in line, f"{citation.label()} no longer reads {citation.text!r}"
    measured = conventions.measure_family(family)
    width = measured["width"]
    assert measured["positions_added"] == (family.positions == "learned, added")
    assert measured["normalised"] == family.normalised
    if not family.normalised:
        assert measured["input_scale"] == pytest.approx(declared_factor(family.input_scale, width))
        assert measured["input_residual"] < 1e-5
    assert measured["tied"] == family.tied
    assert measured["logit_scale"] == pytest.approx(
        declared_factor(family.logit_scale, width), rel=1e-3
    )
    assert measured["logit_residual"] < 1e-3
    if family.soft_cap is None:
        assert measured["soft_cap"] is None
    else:
        assert measured["soft_cap"] == pytest.approx(family.soft_cap, rel=1e-4)
    # The committed JSON (the page's table) holds the same measurement.
    row = next(row for row in results["families"] if row["family"] == name)
    for key, value in measured.items():
        if isinstance(value, float):
            assert row[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        else:
            assert row[key] == value, key


def test_the_input_scale_is_applied_in_the_compute_dtype(conventions):
    """Gemma multiplies by sqrt(d) cast to the compute dtype: under bfloat16 the
    factor is sqrt(d) rounded to 8 significant bits (sqrt(24) = 4.899 -> 4.90625)."""
    import keras
    import keras_hub
    import numpy as np

    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=97,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=24,
        intermediate_dim=32,
        head_dim=8,
        dtype="bfloat16",
    )
    ids = np.array([[3, 5, 7]], "int32")
    first = conventions.first_hidden_state(
        backbone, {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    )
    table = keras.ops.cast(backbone.token_embedding.embeddings, "float32")
    rows = conventions.to_numpy(table).astype(np.float64)[ids]
    rounded = keras.ops.cast(keras.ops.cast(math.sqrt(24), "bfloat16"), "float32")
    factor = float(keras.ops.convert_to_numpy(rounded))
    assert factor == 4.90625
    np.testing.assert_allclose(first, factor * rows, rtol=1e-2)
    assert abs(first / rows - factor).max() < abs(first / rows - math.sqrt(24)).max()


def test_page_shows_the_tables_and_figures_the_script_wrote(conventions, results):
    page = PAGE.read_text()
    on_page = conventions.page_tables(page)
    tables = conventions.markdown_tables(results)
    assert set(on_page) == set(tables)
    for name, text in tables.items():
        assert on_page[name] == text, f"table {name!r} differs from {conventions.RESULTS.name}"
    linked = set(re.findall(r"\]\((figures/conventions_[\w.]+\.png)\)", page))
    assert linked == set(results["figures"].values())
    for link in linked:
        assert (PAGE.parent / link).stat().st_size < 150_000, link


def test_the_experiment_covers_five_conventions_four_widths_five_seeds(results):
    training = results["training"]
    assert len(training["conventions"]) >= 5
    assert training["config"]["widths"] == [64, 128, 256, 512]
    assert len(training["config"]["seeds"]) == 5
    assert len(training["cells"]) == len(training["conventions"]) * 4
    for cell in training["cells"].values():
        assert len(cell["runs"]) == 5


def test_initial_logit_scale_follows_from_the_settings(conventions):
    """The first training measurement, in seconds: a tied output on a
    normal(0, d^-0.5) matrix starts with logits of std about 1; T5's N(0, 1)
    matrix with `logit_scale = d^-0.5` too; GPT-2's N(0, 0.01) about 0.01 sqrt(d)."""
    import numpy as np

    config = conventions.task_config(64, 8)
    ids, _, weights = conventions.make_task(config, 64, 0)
    expected = {"2017 Transformer (our defaults)": 1.0, "T5": 0.88, "GPT-2": 0.08}
    for name, std in expected.items():
        model = conventions.build_convention(config, conventions.CONVENTIONS[name])
        logits = np.asarray(model.predict(ids, verbose=0))[weights > 0]
        assert logits.std() == pytest.approx(std, rel=0.3), name


@pytest.mark.slow
def test_quick_run_writes_json_figures_and_tables(tmp_path, conventions):
    before = PAGE.read_text()
    subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path), "--workers", "1"],
        check=True,
        cwd=ROOT,
        timeout=900,
    )
    results = json.loads((tmp_path / "conventions.json").read_text())
    assert results["training"]["config"]["widths"] == [64, 128]
    assert len(results["training"]["cells"]) == 2 * len(conventions.CONVENTIONS)
    tables = conventions.markdown_tables(results)
    assert "| d=64 | d=128 |" in tables["accuracy"]
    for figure in results["figures"].values():
        assert (tmp_path / Path(figure).name).exists()
    assert PAGE.read_text() == before, "--quick must leave the page alone"
