"""The conformance set exported: public example models, written as their authors wrote them.

Each model of `tests/conformance/` (keras.io examples, the TensorFlow
Transformer tutorial; its package docstring says why these) is built and
trained a few steps, saved as a `.keras` file and loaded back, which must give
the outputs it gave before saving; then the file is exported with the default
flags, as a user would, and the report must say it passed.

Each test records, as junit properties (`-o junit_family=xunit1
--junitxml=FILE`; pytest's default xunit2 drops them), the seconds to build
and to export, whether the export passed, its failure, the report's warnings,
what the slim stage fused and declined and the seconds of each stage, so a
run is also the conformance table. Every model passes with the default flags.

Marked `conformance`, which the default run leaves out:
`python -m pytest -m conformance tests/test_conformance_models.py` (four to
five minutes on two shared cores; the bidirectional LSTM's validation is a
quarter of it).
"""

import json
import time

import keras
import numpy as np
import pytest

from keras_layers.export import ExportError, ExportOptions, export_model
from tests import conformance

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    # The examples' own Keras warnings (masks their custom layers drop, a loss
    # from_logits on softmax outputs): the models are kept as written.
    pytest.mark.filterwarnings("ignore::UserWarning:keras.*"),
]

SAMPLE_ROWS = 4


def _sample(module):
    """The first rows of the model's training inputs."""
    return keras.tree.map_structure(lambda array: array[:SAMPLE_ROWS], module.training_data()[0])


def _outputs(model, inputs) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(x) for x in keras.tree.flatten(model(inputs))]


def _record_report(record_property, report: dict) -> None:
    graph = report.get("graph") or {}
    record_property("passed", report.get("passed"))
    record_property("warnings", json.dumps(report.get("warnings") or []))
    record_property("fused", json.dumps({op: n for op, n in graph.get("fused", {}).items() if n}))
    record_property("declined", json.dumps(graph.get("declined") or {}))
    record_property("inputs", json.dumps(report.get("inputs") or []))
    record_property("worst", json.dumps(report.get("worst")))
    record_property("stage_seconds", json.dumps(report.get("stage_seconds")))


@pytest.mark.parametrize("name", list(conformance.MODELS))
def test_round_trips_through_keras_file_and_exports_with_default_flags(
    name, tmp_path, record_property
):
    module = conformance.MODELS[name]
    record_property("source", module.SOURCE)

    start = time.perf_counter()
    model = module.build()
    record_property("build_seconds", round(time.perf_counter() - start, 2))

    path = tmp_path / f"{name}.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    sample = _sample(module)
    for before, after in zip(_outputs(model, sample), _outputs(loaded, sample), strict=True):
        np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)

    options = ExportOptions(input_roles=getattr(module, "INPUT_ROLES", {}))
    start = time.perf_counter()
    try:
        report = export_model(path, tmp_path / f"{name}.onnx", options)
    except ExportError as error:
        record_property("export_seconds", round(time.perf_counter() - start, 2))
        record_property("failure", f"{type(error).__name__} (exit {error.exit_code}): {error}")
        if getattr(error, "report", None):
            _record_report(record_property, error.report)
        raise
    record_property("export_seconds", round(time.perf_counter() - start, 2))
    _record_report(record_property, report)
    assert report["passed"]
