"""The experiment behind docs/why-scale.md: its analytic expectations hold, and the
page shows what the script measured.

The full experiment takes minutes (`python docs/experiments/why_scale.py`); these
checks take seconds. Each analytic formula is compared with a fresh measurement
at d = 64, within a few standard errors of that measurement, so a wrong formula
(a variance of a^2/2 instead of a^2/3, say) fails.
"""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "experiments" / "why_scale.py"
PAGE = ROOT / "docs" / "why-scale.md"
WIDTH = 64
STANDARD_ERRORS = 5

pytestmark = pytest.mark.tensorflow_only  # the script sets TensorFlow's thread pools


@pytest.fixture(scope="module")
def why_scale():
    return load_script(SCRIPT.relative_to(ROOT), "why_scale")


@pytest.mark.parametrize("initialiser", ["uniform", "normal", "glorot_uniform"])
def test_embedding_norm_matches_the_initialiser_variance(why_scale, initialiser):
    from keras_layers import ScaledEmbedding

    layer = ScaledEmbedding(
        why_scale.VOCABULARY,
        WIDTH,
        embeddings_initializer=why_scale.keras_initializer(initialiser, WIDTH),
    )
    scaled = why_scale.to_numpy(layer(np.arange(100))).astype(np.float64)  # builds the layer
    rows = why_scale.to_numpy(layer.embeddings).astype(np.float64)
    square_norms = np.sum(rows**2, axis=-1)
    standard_error = square_norms.std() / math.sqrt(len(square_norms))
    expected = why_scale.expected_norm(WIDTH, why_scale.initialiser_variance(initialiser, WIDTH))
    assert abs(square_norms.mean() - expected**2) < STANDARD_ERRORS * standard_error
    # The layer's output is the same vectors times sqrt(d).
    np.testing.assert_allclose(scaled, math.sqrt(WIDTH) * rows[:100], rtol=1e-6)


def test_every_encoding_vector_has_norm_sqrt_half_d(why_scale):
    encoding = why_scale.position_encoding(1000, WIDTH)
    norms = np.linalg.norm(encoding.astype(np.float64), axis=-1)
    np.testing.assert_allclose(norms, why_scale.position_encoding_norm(WIDTH), rtol=1e-5)
    assert why_scale.position_encoding_norm(WIDTH) == math.sqrt(32)


def test_logit_std_of_tied_and_untied_outputs(why_scale):
    import keras

    from keras_layers import ScaledEmbedding, TiedOutputDense

    vocabulary = why_scale.VOCABULARY
    hidden = np.random.default_rng(0).standard_normal((1, 32, WIDTH)).astype("float32")
    square_norm = float(np.mean(np.sum(hidden.astype(np.float64) ** 2, -1)))
    embedding = ScaledEmbedding(vocabulary, WIDTH)  # default: normal(0, d^-0.5)
    untied = keras.layers.Dense(vocabulary)  # default: glorot_uniform
    cases = [
        (TiedOutputDense(embedding), 1.0 / WIDTH),
        (untied, why_scale.glorot_uniform_variance(WIDTH, vocabulary)),
    ]
    for head, variance in cases:
        logits = why_scale.to_numpy(head(hidden)).astype(np.float64)
        expected = why_scale.expected_logit_std(square_norm, variance)
        # Rows share the output matrix, so count only its columns as independent:
        # the relative standard error of a std from n samples is about 1 / sqrt(2n).
        tolerance = STANDARD_ERRORS * expected / math.sqrt(2 * vocabulary)
        assert abs(logits.std() - expected) < tolerance


def test_page_shows_the_tables_and_figures_the_script_wrote(why_scale):
    results = json.loads(why_scale.RESULTS.read_text())
    page = PAGE.read_text()
    for name, text in why_scale.markdown_tables(results).items():
        assert text in page, f"table {name!r} on {PAGE.name} differs from {why_scale.RESULTS.name}"
    linked = set(re.findall(r"\]\((figures/[\w.]+\.png)\)", page))
    assert linked == set(results["figures"].values())
    for link in linked:
        assert (PAGE.parent / link).stat().st_size < 150_000, link
