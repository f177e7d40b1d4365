"""Image inputs read from the model: the role, the axes, the sizes, the grid.

keras-hub image classifiers (ResNet, DenseNet, ViT) are built tiny from their
constructors with redrawn weights, and plain Keras CNNs in both layouts; each
is exported with the default flags. The tests check what the issue asked of
images: the role and axes read from the model (never `keras_tensor_N`,
never `BxS`), the sizes the model takes found before any conversion (a
DenseNet pools a 1x1 image into NaN: the grid starts where Keras gives a
finite map), sizes it does not take refused naming them, structured images
beside random ones, and output axes named only when they are the input's.
"""

import json

import keras
import keras_hub
import numpy as np
import onnx
import pytest

from keras_layers.export import (
    ExportOptions,
    export_model,
    image_model,
    images,
    loading,
    validating,
)
from keras_layers.export.cli import EXIT_USAGE, main
from keras_layers.export.errors import UsageError
from tests.models import redrawn as _redrawn
from tests.models import tiny_resnet_classifier as _resnet

pytestmark = [pytest.mark.tensorflow_only, pytest.mark.xdist_group("image_inputs")]


def _densenet():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.DenseNetBackbone(
        stackwise_num_repeats=[1, 1], image_shape=(None, None, 3)
    )
    return _redrawn(keras_hub.models.DenseNetImageClassifier(backbone, num_classes=5))


def _vit():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3),
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        mlp_dim=32,
    )
    return _redrawn(keras_hub.models.ViTImageClassifier(backbone, num_classes=5))


def _segmenter():
    """A plain Keras CNN whose first map keeps the image's size ("same") and
    whose second is strided: the first output follows height and width, the
    second does not."""
    keras.utils.set_random_seed(0)
    pixels = keras.Input(shape=(None, None, 3))
    same = keras.layers.Conv2D(4, 3, padding="same")(pixels)
    strided = keras.layers.Conv2D(4, 3, strides=2)(same)
    return keras.Model(pixels, [same, strided])


def _onnx_axes(path, which: str) -> dict:
    graph = onnx.load(str(path)).graph
    values = graph.input if which == "input" else graph.output
    return {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values
    }


@pytest.fixture(scope="module")
def resnet_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resnet")
    report = export_model(_resnet(), folder / "resnet.onnx")
    return report, folder / "resnet.onnx"


def test_a_keras_hub_image_input_has_its_role_axes_and_a_name_of_its_own(resnet_export):
    report, path = resnet_export
    assert report["passed"]
    (image,) = report["inputs"]
    assert image["role"] == "image" and image["role_source"] == "wiring"
    assert "NHWC images of 3 channels" in image["role_reason"]
    assert image["name"] == "images"  # Keras named it keras_tensor_N
    assert image["shape"] == ["batch", "height", "width", 3]
    assert _onnx_axes(path, "input") == {"images": ["batch", "height", "width", 3]}


def test_the_grid_speaks_in_images_at_two_sizes_and_structured_ones(resnet_export):
    report, _ = resnet_export
    labels = [check["shape"] for check in report["checks"]]
    sides = {label.split("x")[1] for label in labels if not label.startswith("structured")}
    assert len(sides) >= 2, labels  # size-agnostic: at least two image sizes
    assert {label.split("x")[0] for label in labels} >= {"1", "8"}  # batch 1 and > 1
    assert all(label.endswith("x3") for label in labels), labels
    assert any(label.startswith("structured 3x") for label in labels), labels


def test_structured_images_are_a_gradient_edges_and_a_constant():
    info = loading.TensorInfo(
        "images",
        (None, None, None, 3),
        "float32",
        role="image",
        axes=("batch", "height", "width", 3),
        layout="NHWC",
    )
    batch = images.draw(info, 3, (8, 12), np.random.default_rng(0), structured=True)
    assert batch.shape == (3, 8, 12, 3)
    np.testing.assert_allclose(batch[0, 3, :, 0], np.linspace(-1, 1, 12), rtol=1e-6)
    assert set(np.unique(batch[1, ..., 0])) == {-1.0, 1.0}
    assert batch[1, 0, 0, 0] != batch[1, 0, 4, 0]
    assert np.all(batch[2, ..., 0] == 0.5)
    # Each channel weighted apart (1, 0.25, -0.5): a swap of channels shows.
    np.testing.assert_allclose(batch[2, 0, 0], [0.5, 0.125, -0.25])
    nchw = loading.TensorInfo(
        "x",
        (None, 3, None, None),
        "float32",
        role="image",
        axes=("batch", 3, "height", "width"),
        layout="NCHW",
    )
    assert images.draw(nchw, 3, (8, 12), np.random.default_rng(0), True).shape == (3, 3, 8, 12)


def test_a_densenet_is_fed_only_images_it_pools_into_finite_values(tmp_path):
    """Keras pools a 1x1 image's empty map into NaN: before, the default grid
    fed 1x1 and the export failed validation on Keras' own NaN."""
    model = _densenet()
    report = export_model(model, tmp_path / "densenet.onnx")
    assert report["passed"]
    smallest = min(int(c["shape"].split("x")[1]) for c in report["checks"] if c["shape"][0] != "s")
    assert smallest > 1
    one = np.zeros((1, 1, 1, 3), "float32")
    assert not np.isfinite(np.asarray(model(one))).all()  # why 1 is not a size it takes


def test_a_side_the_model_does_not_take_exits_2_naming_the_sides_it_takes(tmp_path, capsys):
    path = tmp_path / "densenet.keras"
    _densenet().save(path)
    code = main([str(path), "-o", str(tmp_path / "d.onnx"), "--shapes", "2x1", "-q"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "does not take images of side 1" in err and "pixels a side at least" in err
    assert "--shapes 2x" in err  # the fix
    assert not (tmp_path / "d.onnx").exists()


def test_a_fixed_size_vit_is_fed_its_own_size(tmp_path):
    report = export_model(_vit(), tmp_path / "vit.onnx")
    assert report["passed"]
    assert report["inputs"][0]["shape"] == ["batch", 32, 32, 3]
    assert {c["shape"].split(" ")[-1].split("x", 1)[1] for c in report["checks"]} == {"32x32x3"}


def test_output_axes_are_named_after_the_images_only_where_they_are_its_own(tmp_path):
    # (TensorFlow runs no channels-first Conv2D on a CPU: NHWC is what it exports.)
    report = export_model(_segmenter(), tmp_path / "seg.onnx")
    assert report["passed"]
    (image_axes,) = _onnx_axes(tmp_path / "seg.onnx", "input").values()
    same, strided = _onnx_axes(tmp_path / "seg.onnx", "output").values()
    assert image_axes == ["batch", "height", "width", 3]
    assert same == ["batch", "height", "width", 4]
    # A strided map is about half the image's size: never named as the image's.
    assert "height" not in strided and "width" not in strided and len(strided) == 4


def test_an_unnamed_text_input_is_named_after_its_role(tmp_path):
    ids = keras.Input(shape=(None,), dtype="int32")
    hidden = keras.layers.Embedding(50, 8)(ids)
    model = keras.Model(ids, keras.layers.Dense(3)(hidden))
    loaded = loading.load(model)
    assert [info.name for info in loaded.inputs] == ["token_ids"]


def test_the_image_sides_found_are_sides_keras_runs_and_the_smallest():
    loaded = loading.load(_densenet())
    sides = validating.image_sides(loaded)
    assert len(sides) >= 2 and sides == tuple(sorted(sides))
    assert all(validating.accepts_side(loaded, side) for side in sides)
    assert not validating.accepts_side(loaded, sides[0] - 1)


def test_the_int8_gate_images_come_in_points_of_bounded_pixels(monkeypatch):
    """The gate needs 1,000 classified images; at a real side they are
    split into points of at most `MAX_GATE_PIXELS` (ResNet-50's 1,000 at
    224 in one point was killed at 24 GB), the points' rows still 1,000."""
    loaded = loading.load(_resnet())
    loaded.image_sides = validating.image_sides(loaded)
    plain = validating.default_shapes(loaded)
    side = loaded.image_sides[min(1, len(loaded.image_sides) - 1)]
    whole = validating.default_shapes(loaded, int8=True)
    assert whole == [*plain[:-1], (1000, side), plain[-1]]  # a small side: one point
    monkeypatch.setattr(validating, "MAX_GATE_PIXELS", 64 * side * side + side)
    split = validating.default_shapes(loaded, int8=True)
    gate = split[len(plain) - 1 : -1]
    assert split[: len(plain) - 1] == plain[:-1] and split[-1] == plain[-1]
    assert gate == [(64, side)] * 16  # 1,024 rows: the 1,000 the gate counts, and a few more


def test_the_smallest_side_and_the_sides_near_follow_what_the_model_takes():
    takes = lambda side: side >= 10 and side % 4 == 0  # noqa: E731 - a model's rule
    assert validating.smallest_accepted(takes, 512) == 12
    assert images.accepted_near(takes, 37, 12) == 40
    assert validating.smallest_accepted(lambda side: False, 64) is None


def test_the_options_grid_takes_the_structured_point():
    assert validating.check_shapes([(1, 32), "structured"]) == [(1, 32), "structured"]
    assert ExportOptions(shapes=((1, 32), "structured")).shapes


def _classifier_with_converter(scale=1 / 127.5, offset=-1.0):
    """A ResNet classifier built with its preprocessor: an image converter
    that crops to the aspect ratio, resizes to 32x32, rescales and offsets."""
    task = _resnet()
    converter = keras_hub.layers.ResNetImageConverter(
        image_size=(32, 32), scale=scale, offset=offset
    )
    preprocessor = keras_hub.models.ResNetImageClassifierPreprocessor(image_converter=converter)
    return keras_hub.models.ResNetImageClassifier(
        task.backbone, num_classes=5, preprocessor=preprocessor
    )


def test_with_preprocessor_takes_decoded_images_of_any_size_as_predict_does(tmp_path, capsys):
    """Before, `--with-preprocessor` on an image task said "has no text
    preprocessor"; now the converter is in the file and the file matches
    `task.predict` on raw uint8 images of other sizes and aspect ratios."""
    import onnxruntime as ort

    task = _classifier_with_converter()
    path = tmp_path / "classifier.keras"
    task.save(path)
    out = tmp_path / "classifier.onnx"
    assert main([str(path), "-o", str(out), "--with-preprocessor", "-q"]) == 0
    report = json.loads((tmp_path / "classifier.report.json").read_text())
    (image,) = report["inputs"]
    assert (image["name"], image["dtype"], image["role"]) == ("images", "uint8", "image")
    assert report["image_converter"]["predict"]["passed"]
    assert report["image_converter"]["config"]["image_size"] == [32, 32]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    raw = np.random.default_rng(5).integers(0, 256, (2, 45, 70, 3), dtype=np.uint8)
    (got,) = session.run(None, {"images": raw})
    np.testing.assert_allclose(got, task.predict(raw, verbose=0), atol=1e-4, rtol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "classifier.keras",
        "classifier.onnx",
        "classifier.report.json",
    ]


def test_the_predict_check_fails_a_file_of_another_converter(tmp_path):
    """The second oracle can fail: a file whose converter scales differently
    (1/255 and no offset against 1/127.5 - 1) differs from predict."""
    right = _classifier_with_converter()
    wrong = _classifier_with_converter(scale=1 / 255, offset=None)
    wrong.set_weights(right.get_weights())
    export_model(wrong, tmp_path / "wrong.onnx", ExportOptions(preprocessor=True))
    found = image_model.check_predict(right, tmp_path / "wrong.onnx", 1e-4, 1e-5)
    assert not found["passed"] and found["max_abs_diff"] > 1e-2


def test_a_task_without_a_converter_or_tokenizer_is_refused_naming_both(tmp_path, capsys):
    path = tmp_path / "bare.keras"
    _resnet().save(path)
    assert main([str(path), "-o", str(tmp_path / "b.onnx"), "--with-preprocessor"]) == EXIT_USAGE
    assert "no preprocessor with a tokenizer or an image converter" in capsys.readouterr().err


def test_images_a_model_rescales_from_pixels_are_drawn_as_pixels(tmp_path):
    """keras.io's "image classification from scratch" divides by 255 first:
    N(0, 1) images reached it as near-constant ones (a channel swap passed
    validation). Images read through Rescaling(1/255) are drawn over 0..255."""
    pixels = keras.Input(shape=(None, None, 3))
    hidden = keras.layers.Rescaling(1.0 / 255)(pixels)
    hidden = keras.layers.Conv2D(4, 3)(hidden)
    model = keras.Model(pixels, keras.layers.GlobalAveragePooling2D()(hidden))
    (info,) = loading.load(model).inputs
    assert info.value_range == (0, 255) and "pixel values 0..255" in info.role_reason
    drawn = images.draw(info, 2, 8, np.random.default_rng(0))
    assert drawn.min() >= 0 and drawn.max() > 200
    structured = images.draw(info, 3, 8, np.random.default_rng(0), structured=True)
    assert structured.min() >= 0 and structured.max() <= 255


def test_a_grouped_conv_converts_to_onnxs_grouped_conv(tmp_path):
    """Keras runs a grouped Conv2D (keras.io's ConvMixer writes one) through an
    XLA-compiled function on TensorFlow; tf2onnx stopped at its
    PartitionedCall. It is traced as TensorFlow's Conv2D and becomes one
    `Conv` with `group`, validated against Keras (which still runs it with XLA)."""
    keras.utils.set_random_seed(0)
    pixels = keras.Input(shape=(None, None, 8))
    hidden = keras.layers.Conv2D(8, 3, groups=4, padding="same")(pixels)
    hidden = keras.layers.Conv2D(6, 3, groups=2)(hidden)
    model = keras.Model(pixels, keras.layers.GlobalAveragePooling2D()(hidden))
    report = export_model(model, tmp_path / "grouped.onnx")
    assert report["passed"]
    groups = [
        next((a.i for a in node.attribute if a.name == "group"), 1)
        for node in onnx.load(str(tmp_path / "grouped.onnx")).graph.node
        if node.op_type == "Conv"
    ]
    assert groups == [4, 2]


def test_a_bilinear_upsampling_on_free_sides_converts_to_onnxs_resize(tmp_path):
    """Keras' `ops.image.resize` checks `size[0] <= 0` in Python, which a
    traced tensor cannot answer: a bilinear `UpSampling2D` on free sides (a
    U-Net's decoder as keras.io writes it, BASNet's) did not trace. It
    becomes ONNX's `Resize` at the input's own sides times the factor, and
    the grid's sizes are checked against Keras; a size that is a number keeps
    Keras' check (a zero size is still Keras' own ValueError)."""
    keras.utils.set_random_seed(0)
    pixels = keras.Input(shape=(None, None, 3))
    hidden = keras.layers.Conv2D(4, 3, strides=2, padding="same")(pixels)
    hidden = keras.layers.UpSampling2D(2, interpolation="bilinear")(hidden)
    model = keras.Model(pixels, keras.layers.Conv2D(2, 1)(hidden))
    report = export_model(model, tmp_path / "unet.onnx")
    assert report["passed"]
    assert len({check["shape"] for check in report["checks"]}) > 3  # sides of several sizes
    graph = onnx.load(str(tmp_path / "unet.onnx")).graph
    (resize,) = [node for node in graph.node if node.op_type == "Resize"]
    modes = {a.name: a.s.decode() for a in resize.attribute if a.type == onnx.AttributeProto.STRING}
    assert modes["mode"] == "linear" and modes["coordinate_transformation_mode"] == "half_pixel"
    from keras_layers.export import tracing

    with tracing._resizes_to_traced_sizes(), pytest.raises(ValueError, match="positive height"):
        keras.ops.image.resize(np.zeros((1, 4, 4, 3), "float32"), (0, 4))


def test_channels_first_takes_nchw_images_and_leaves_no_transpose(tmp_path):
    """`--channels-first`: the file takes (batch, channels, height, width), as
    optimum's vision files do; its one Permute cancels against the first Conv's
    Transpose, and the file computes Keras' outputs on the NHWC images."""
    import onnxruntime as ort

    model = _resnet()
    path = tmp_path / "resnet.keras"
    model.save(path)
    out = tmp_path / "nchw.onnx"
    assert main([str(path), "-o", str(out), "--channels-first", "-q"]) == 0
    assert _onnx_axes(out, "input") == {"images": ["batch", 3, "height", "width"]}
    ops = [node.op_type for node in onnx.load(str(out)).graph.node]
    assert "Transpose" not in ops
    nhwc = np.random.default_rng(3).standard_normal((2, 40, 30, 3)).astype("float32")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"images": nhwc.transpose(0, 3, 1, 2)})
    np.testing.assert_allclose(got, model(nhwc, training=False), atol=1e-5, rtol=1e-4)


def test_channels_first_without_an_image_is_refused(tmp_path, capsys):
    ids = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(ids, keras.layers.Embedding(10, 4)(ids))
    path = tmp_path / "text.keras"
    model.save(path)
    assert main([str(path), "-o", str(tmp_path / "t.onnx"), "--channels-first"]) == EXIT_USAGE
    assert "takes no NHWC image" in capsys.readouterr().err
    assert not (tmp_path / "t.onnx").exists()


def test_channels_first_is_refused_where_it_cannot_apply(tmp_path):
    with pytest.raises(UsageError, match="not taken with preprocessor=True"):
        ExportOptions(channels_first=True, preprocessor=True)
    with pytest.raises(UsageError, match="images as NCHW are for the forward pass"):
        export_model(
            _resnet(), tmp_path / "x/", ExportOptions(channels_first=True), task="causal-lm"
        )


def _timed(speedup: float):
    """`quantizing.latency` as if the int8 file ran at `speedup` x float32's speed."""

    def latency(float_path, int8_path, feeds, rounds=7):
        assert float_path.exists() and int8_path.exists() and feeds
        return {
            "float32_ms": 10.0,
            "int8_ms": round(10.0 / speedup, 3),
            "speedup": speedup,
            "rounds": rounds,
            "shape": {k: list(v.shape) for k, v in feeds.items()},
        }

    return latency


def test_an_int8_cnn_says_its_convolutions_keep_float32_weights(tmp_path, monkeypatch):
    """int8 quantizes MatMul and Gather weights only: a CNN's file quantizes
    its classifier head, and the report counts the convolutions left float."""
    from keras_layers.export import quantizing

    monkeypatch.setattr(quantizing, "latency", _timed(1.25))
    report = export_model(_resnet(), tmp_path / "resnet.onnx", ExportOptions(quantize="int8"))
    assert report["int8"]["float_convolutions"] == 9
    assert report["int8"]["kept"] and report["int8"]["latency"]["speedup"] == 1.25
    ops = [node.op_type for node in onnx.load(str(tmp_path / "resnet.int8.onnx")).graph.node]
    assert ops.count("Conv") == 9 and "ConvInteger" not in ops


@pytest.mark.parametrize(("speedup", "int8_ms"), [(0.8, "12.5"), (1.02, "9.804")])
def test_an_int8_cnn_not_faster_than_float32_is_not_kept(tmp_path, monkeypatch, speedup, int8_ms):
    """int8 CNNs are often slower on CPU: accurate but slower, or faster by
    less than the noise of the timing (`MIN_KEPT_SPEEDUP`), the file is left
    out, said in the warnings with both times; the export passes."""
    from keras_layers.export import quantizing

    monkeypatch.setattr(quantizing, "latency", _timed(speedup))
    report = export_model(_resnet(), tmp_path / "resnet.onnx", ExportOptions(quantize="int8"))
    assert report["passed"] and report["int8"]["passed"] and not report["int8"]["kept"]
    assert report["int8"]["onnx_path"] is None
    assert not (tmp_path / "resnet.int8.onnx").exists() and (tmp_path / "resnet.onnx").exists()
    assert any(f"{int8_ms} ms against float32's 10.0 ms" in w for w in report["warnings"])


def test_the_int8_latency_is_measured_on_both_files_side_by_side(tmp_path):
    """The figures themselves, on real files: both positive, the ratio theirs."""
    from keras_layers.export import quantizing

    report = export_model(_resnet(), tmp_path / "resnet.onnx", ExportOptions(quantize="int8"))
    speed = report["int8"]["latency"]
    assert speed["float32_ms"] > 0 and speed["int8_ms"] > 0 and speed["rounds"] == 7
    assert speed["speedup"] == pytest.approx(speed["float32_ms"] / speed["int8_ms"], rel=1e-2)
    assert report["int8"]["kept"] == (speed["speedup"] >= quantizing.MIN_KEPT_SPEEDUP)
    assert quantizing.LATENCY_ROUNDS == 7


class _TablePositions(keras.layers.Layer):
    """Adds rows of a table of `rows` positions by gathering them, as
    keras-hub's PARSeq decoder does: no `sequence_length` says its bound."""

    def __init__(self, rows, **kwargs):
        super().__init__(**kwargs)
        self.rows = rows

    def build(self, input_shape):
        self.table = self.add_weight(shape=(self.rows, input_shape[-1]), name="table")

    def call(self, x):
        positions = keras.ops.arange(keras.ops.shape(x)[1])
        return x + keras.ops.take(self.table, positions, axis=0)


def _image_and_text(text_rows: int | None):
    """Image patches with a position table of 16 rows (keras-hub's
    `PositionEmbedding`, whose `sequence_length` is the images'), prepended
    to a text that masks its padding and has a table of `text_rows` rows
    of its own (None: no table, any length)."""
    keras.utils.set_random_seed(0)
    pixels = keras.Input((16, 16, 3), name="images")
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    patches = keras.layers.Reshape((16, 48))(
        keras.layers.Conv2D(48, 4, strides=4, name="patches")(pixels)
    )
    patches = keras.layers.Dense(8)(patches)
    patches = patches + keras_hub.layers.PositionEmbedding(16)(patches)
    text = keras.layers.Embedding(30, 8)(ids)
    if text_rows is not None:
        text = _TablePositions(text_rows)(text)
    hidden = keras.layers.Concatenate(axis=1)([patches, text])
    keep = keras.layers.Concatenate(axis=1)(
        [keras.ops.ones_like(patches[..., 0]), keras.ops.cast(mask, "float32")]
    )
    attention = keras.layers.MultiHeadAttention(2, 4)(
        hidden, hidden, attention_mask=keep[:, None, :] > 0
    )
    return keras.Model({"images": pixels, "token_ids": ids, "padding_mask": mask}, attention)


def test_an_image_position_table_does_not_bound_the_text(tmp_path):
    """PaliGemma's vision encoder holds a table of its 16 patches, and its
    text takes any length: the grid fed 16 tokens at every point, and a file
    that baked 16 + 16 positions into its Reshapes passed. The table is
    checked against Keras and set aside; a padded batch of the longer text
    (64) exercises the mask."""
    report = export_model(_image_and_text(None), tmp_path / "m.onnx")
    assert report["passed"]
    assert any(
        "positions of layer" in note and "not the text's" in note for note in report["warnings"]
    )
    checks = {check["shape"]: check for check in report["checks"]}
    assert "padded" in checks


def test_a_text_table_no_attribute_names_is_found_by_keras_itself(tmp_path):
    """keras-hub's PARSeq reads a table of 9 positions inside its decoder,
    which nothing names: the grid fed 16 tokens and Keras itself failed. The
    longest text Keras runs is searched, said, and the grid keeps within it."""
    report = export_model(_image_and_text(9), tmp_path / "m.onnx")
    assert report["passed"]
    assert any("at most 9 tokens" in note for note in report["warnings"])
