"""A detector's detections compared after its own decoding (`detections`).

keras-hub's RetinaNet exports its raw outputs (box deltas and class logits
per anchor); what a user gets is `decode_predictions` of them: boxes from
the anchors, then non-maximum suppression. The forward export decodes both
sides with the model's own decoder at every grid point. These tests build a
tiny RetinaNet whose box deltas are those of a trained one (small, so that
the decoded boxes lie near the image), check that the export compares its
detections and passes them, that a file whose two classes are swapped fails
on the detections, and that an untrained model's overflowing boxes are said
to be compared by nothing rather than passed as compared.
"""

import numpy as np
import onnx
import pytest
import zoo_vision
from onnx import numpy_helper

from keras_layers.export import ExportOptions, ValidationFailed, detections, export_model, validate

pytestmark = [
    pytest.mark.tensorflow_only,
    pytest.mark.filterwarnings("ignore::UserWarning:keras.*"),
]


def _retinanet():
    """A tiny RetinaNet as Keras initialises it, its box deltas shrunk to a
    trained model's size (x 0.01: within a few tenths)."""
    model = zoo_vision.build("RetinaNetObjectDetector", redrawn=False)
    layer = model.box_head.prediction_layer
    layer.kernel.assign(np.asarray(layer.kernel) * 0.01)
    layer.bias.assign(np.zeros(layer.bias.shape, "float32"))
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = _retinanet()
    path = tmp_path_factory.mktemp("retinanet") / "retinanet.onnx"
    return model, path, export_model(model, path, ExportOptions(shapes=[(2, 64), (3, 96)]))


def test_the_export_compares_the_decoded_detections(exported):
    import keras

    model, _, report = exported
    found = [c for c in report["checks"] if c["output"] == detections.OUTPUT]
    assert [c["shape"] for c in found] == ["2x64x64x3", "3x96x96x3"]
    assert all(c["passed"] and c["problem"] is None for c in found), found
    # The decoder kept detections there: the comparison had something to match.
    images = np.random.default_rng(0).standard_normal((2, 64, 64, 3)).astype("float32")
    kept = model.decode_predictions(model(images), images)["num_detections"]
    assert int(np.min(keras.ops.convert_to_numpy(kept))) > 0


def _classes_swapped(path, out) -> None:
    """The file's class logits with classes 0 and 1 swapped: the class head's
    last Conv reads its kernel's and bias's output channels swapped (each
    anchor's 3 classes are adjacent channels)."""
    proto = onnx.load(str(path))
    weights = {t.name: t for t in proto.graph.initializer}
    classes = 3
    for node in proto.graph.node:
        if node.op_type != "Conv" or len(node.input) < 3:
            continue
        kernel = numpy_helper.to_array(weights[node.input[1]])
        if kernel.shape[0] % classes or kernel.shape[0] == 4 * (kernel.shape[0] // 4):
            continue  # not the class head's prediction (anchors x classes, not x 4)
        order = np.arange(kernel.shape[0]).reshape(-1, classes)[:, [1, 0, 2]].ravel()
        for index in (1, 2):
            value = numpy_helper.to_array(weights[node.input[index]])[order]
            weights[node.input[index]].CopyFrom(numpy_helper.from_array(value, node.input[index]))
    onnx.save(proto, str(out))


def test_a_file_with_two_classes_swapped_fails_on_its_detections(exported, tmp_path):
    model, path, _ = exported
    mutant = tmp_path / "swapped.onnx"
    _classes_swapped(path, mutant)
    with pytest.raises(ValidationFailed) as failed:
        validate(model, mutant, ExportOptions(shapes=[(2, 64)]))
    found = [c for c in failed.value.report["checks"] if c["output"] == detections.OUTPUT]
    assert found and not found[0]["passed"]
    assert "Keras detects class" in found[0]["problem"]


def test_matching_is_by_set_and_tolerates_only_the_threshold(exported):
    boxes = np.array([[[0, 0, 10, 10], [5, 5, 20, 20]]], "float32")
    keras_found = {
        "boxes": boxes,
        "confidence": np.array([[0.9, 0.8]], "float32"),
        "labels": np.array([[1, 2]]),
        "num_detections": np.array([2]),
    }
    reordered = {k: v[:, ::-1] if v.ndim > 1 else v for k, v in keras_found.items()}
    assert detections.compare("p", keras_found, reordered, 1e-4, 1e-5, 0.5, 32)["passed"]
    moved = {**keras_found, "boxes": boxes + np.array([0, 0, 0, 0.5], "float32")}
    assert not detections.compare("p", keras_found, moved, 1e-4, 1e-5, 0.5, 32)["passed"]
    fewer = {**keras_found, "num_detections": np.array([1])}
    assert not detections.compare("p", keras_found, fewer, 1e-4, 1e-5, 0.5, 32)["passed"]
    at_threshold = {**keras_found, "confidence": np.array([[0.9, 0.5004]], "float32")}
    assert detections.compare(
        "p", at_threshold, {**at_threshold, "num_detections": np.array([1])}, 1e-4, 1e-5, 0.5, 32
    )["passed"]


def test_overflowing_boxes_are_said_to_be_compared_by_nothing():
    found = {
        "boxes": np.array([[[0, -np.inf, 1e3, np.inf]]], "float32"),
        "confidence": np.array([[1.0]], "float32"),
        "labels": np.array([[0]]),
        "num_detections": np.array([1]),
    }
    check = detections.compare("p", found, found, 1e-4, 1e-5, 0.5, 32)
    assert check["passed"] and check["problem"].startswith("not compared: Keras' own boxes")
