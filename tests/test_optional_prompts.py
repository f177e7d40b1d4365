"""A prompt a user may leave out: the model branches on it, and both branches are proved.

keras-hub's SAM adds a mask prompt's embedding to its image features, or a
learned "no mask" vector when the `masks` input holds none (a `cond` on
`shape(masks)[1] == 0`); SAM3 does the same with its boxes. `MaskPrompt`
here is that, small: a convolution of the mask (its kernel read inside the
branch), times the image features (read inside the branch, NHWC, and by a
convolution outside it), and the model's output is named `masks` like its
input (SAM's segmenter).

What the export must get right, each once broken in it: the branch's inputs
have shapes (tf2onnx's Conv handler needs the kernel's), the branch reads
its weights under their new names, the convolution layout pass leaves the
features the branch reads in NHWC, the output named as an input is renamed,
and the grid runs both branches (`unprompted`: one row, no mask): a file
whose branches are swapped fails validation.
"""

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from keras import ops

from keras_layers.export import (
    ExportOptions,
    UsageError,
    ValidationFailed,
    export_model,
    prompts,
    validate,
)

pytestmark = [pytest.mark.tensorflow_only]  # the export pipeline runs on TensorFlow

SIDE, WIDTH = 8, 4


class MaskPrompt(keras.layers.Layer):
    """Image features plus a mask prompt's embedding, or plus a learned
    vector where the prompt holds no mask."""

    def build(self, features_shape, masks_shape):
        self.embed = keras.layers.Conv2D(WIDTH, 3, padding="same", name="mask_embedding")
        self.embed.build((None, SIDE, SIDE, 1))
        self.no_mask = self.add_weight(shape=(WIDTH,), initializer="random_normal", name="none")

    def call(self, features, masks):
        def absent():
            return features + self.no_mask

        def present():
            return features + self.embed(masks[:, 0]) * features[..., :1]

        return ops.cond(ops.equal(ops.shape(masks)[1], 0), absent, present)


def _model():
    keras.utils.set_random_seed(0)
    images = keras.Input((SIDE, SIDE, 3), name="images")
    masks = keras.Input((None, SIDE, SIDE, 1), name="masks")
    features = keras.layers.Conv2D(WIDTH, 3, padding="same", name="image_encoder")(images)
    # Normalized over their channels and read by the branch alone (SAM3's
    # box encoder): the layout pass moved the Transpose to NHWC past them.
    features = keras.layers.LayerNormalization()(features)
    mixed = MaskPrompt()(features, masks)
    return keras.Model({"images": images, "masks": masks}, {"masks": mixed})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = _model()
    path = tmp_path_factory.mktemp("optional_prompts") / "model.onnx"
    return model, path, export_model(model, path)


def _feeds(count: int, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "images": rng.normal(size=(2, SIDE, SIDE, 3)).astype("float32"),
        "masks": rng.normal(size=(2, count, SIDE, SIDE, 1)).astype("float32"),
    }


def test_the_file_computes_both_branches_as_keras_does(exported):
    model, path, report = exported
    assert report["passed"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [output.name for output in session.get_outputs()] == ["masks_output"]
    for count in (0, 1):  # no mask: the learned vector; one: its embedding
        feeds = _feeds(count)
        (got,) = session.run(None, feeds)
        expected = keras.ops.convert_to_numpy(model(feeds)["masks"])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    with_mask, without = (session.run(None, _feeds(count))[0] for count in (1, 0))
    assert not np.allclose(with_mask, without)  # the branches differ, so the check can fail


def test_the_report_says_what_the_mask_is_and_what_the_output_is_called(exported):
    _, _, report = exported
    (masks,) = [entry for entry in report["inputs"] if entry["name"] == "masks"]
    assert masks["role"] == prompts.MASKS
    assert masks["shape"] == ["batch", "masks", SIDE, SIDE, 1]
    assert any("'masks' is named 'masks_output'" in warning for warning in report["warnings"])


def test_the_grid_runs_the_model_with_a_mask_and_without(exported):
    _, _, report = exported
    points = {check["shape"] for check in report["checks"]}
    assert f"{prompts.UNPROMPTED} 1x{SIDE}x{SIDE}x3" in points
    assert any(point.startswith("2x") for point in points)


def _branches_swapped(path, out):
    proto = onnx.load(str(path))
    (node,) = [node for node in proto.graph.node if node.op_type == "If"]
    then_branch, else_branch = (attribute.g for attribute in node.attribute)
    swapped = onnx.GraphProto()
    swapped.CopyFrom(then_branch)
    then_branch.CopyFrom(else_branch)
    else_branch.CopyFrom(swapped)
    onnx.save(proto, str(out))
    return out


def test_a_file_whose_branches_are_swapped_fails_validation(exported, tmp_path):
    """With a mask, the swapped file adds the vector for none: its values
    fail. Without one, it runs the mask's branch on no mask, which ONNX
    Runtime refuses: the check stops there, naming the point."""
    model, path, _ = exported
    swapped = _branches_swapped(path, tmp_path / "swapped.onnx")
    with pytest.raises(ValidationFailed) as caught:
        validate(model, swapped, ExportOptions(shapes=[(2, SIDE)]))
    assert not any(check["passed"] for check in caught.value.report["checks"])
    with pytest.raises(UsageError, match=f"ONNX Runtime fails on the {prompts.UNPROMPTED} 1x"):
        validate(model, swapped, ExportOptions(shapes=[prompts.UNPROMPTED]))
    assert validate(model, path, ExportOptions(shapes=[(2, SIDE), prompts.UNPROMPTED]))["passed"]


def test_an_unprompted_point_is_asked_for_by_name():
    from keras_layers.export.cli import _shapes

    assert _shapes("1x8,unprompted") == [(1, 8), prompts.UNPROMPTED]
    ExportOptions(shapes=[(1, 8), prompts.UNPROMPTED])  # a grid point the API takes
