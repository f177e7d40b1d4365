"""Models that take decoded images: a keras-hub image task and its converter in one file.

`export_image_model(task, output)` exports a keras-hub image task (an
`ImageClassifier`, `ImageSegmenter`, `DepthEstimator`, ... : any task whose
preprocessor holds an `image_converter`) as one ONNX file whose input is a
batch of decoded images, `uint8`, of any height and width, as a decoder
(PIL, OpenCV, `tf.io.decode_image`) leaves them, and whose outputs are the
task's. The converter (resize, with its crop or pad to the aspect ratio,
rescale, normalise) runs in the graph:

1. the model (`with_image_converter`): a Keras model that casts the images
   to float32, as `task.predict` does when its preprocessor runs in
   `tf.data`, and calls the converter, then the task; it is exported by the
   pipeline like any other model, validated over its own grid of images
   (the converter makes every side valid: the grid starts at one pixel);
2. the second oracle (`check_predict`): the file's outputs against
   `task.predict` itself on raw images of several sizes and aspect ratios,
   at the export's tolerances; the report's `image_converter` says what was
   compared and the largest difference.

A task without an image converter is refused with the reason
(`UsageError`); one with a text preprocessor goes to `text_model`.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np

from keras_layers.export import loading, placement
from keras_layers.export.errors import UsageError, ValidationFailed, argument
from keras_layers.export.images import with_names
from keras_layers.export.options import ExportOptions
from keras_layers.export.pipeline import checked_options, export_model

INPUT = "images"
# Raw images of several sizes and aspect ratios, checked against `predict`.
PREDICT_SIZES = ((2, 31, 47), (1, 64, 64), (3, 120, 80))


def image_converter(task_model):
    """The task's image converter, or `None` when it has none."""
    preprocessor = getattr(task_model, "preprocessor", None)
    return getattr(preprocessor, "image_converter", None)


def _channels(task_model) -> int:
    backbone = getattr(task_model, "backbone", None)
    shape = getattr(backbone, "image_shape", None) or (None, None, 3)
    return int(shape[-1] or 3)


def with_image_converter(task_model):
    """A Keras model of `task_model` that takes `uint8` images of any size.

    Args:
        task_model: a keras-hub task whose preprocessor holds an
            `image_converter`.

    Returns:
        The model: `images` (`uint8`, `(batch, height, width, channels)`)
        cast to float32, converted, then the task.

    Raises:
        UsageError: the task has no image converter.
    """
    import keras

    converter = image_converter(task_model)
    if converter is None:
        raise UsageError(
            f"{argument('preprocessor', True)}: {type(task_model).__name__} has no image "
            "converter (a keras-hub image task built with preprocessor=...(image_converter=...)) "
            "to put in the file"
        )
    images = keras.Input(shape=(None, None, _channels(task_model)), dtype="uint8", name=INPUT)
    pixels = keras.ops.cast(images, "float32")
    outputs = task_model(converter(pixels))
    return with_names(task_model, images, outputs, f"{task_model.name}_with_image_converter")


def check_predict(task_model, onnx_path, atol: float, rtol: float) -> dict:
    """The file's outputs against `task_model.predict` on raw `uint8` images.

    Args:
        task_model: the keras-hub task, its preprocessor attached.
        onnx_path: the exported file.
        atol: absolute tolerance.
        rtol: relative tolerance, times |predict's output|.

    Returns:
        `{"sizes", "max_abs_diff", "passed"}`.
    """
    import keras
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    worst, passed = 0.0, True
    for batch, height, width in PREDICT_SIZES:
        raw = rng.integers(0, 256, (batch, height, width, _channels(task_model)), dtype=np.uint8)
        expected = keras.tree.flatten(task_model.predict(raw, verbose=0))
        got = session.run(None, {session.get_inputs()[0].name: raw})
        for value, reference in zip(got, expected, strict=True):
            reference = np.asarray(reference)
            difference = np.abs(value - reference)
            worst = max(worst, float(difference.max(initial=0.0)))
            passed &= bool(np.all(difference <= atol + rtol * np.abs(reference)))
    sizes = ["x".join(map(str, size)) for size in PREDICT_SIZES]
    return {"sizes": sizes, "max_abs_diff": worst, "passed": passed}


def export_image_model(task_model, output, options: ExportOptions | None = None) -> dict:
    """Export a keras-hub image task with its image converter: decoded images in.

    Args:
        task_model: a keras-hub image task with its preprocessor, or the path
            of a `.keras` file holding one.
        output: the ONNX file to write.
        options: the export's `ExportOptions`.

    Returns:
        The report, with an `image_converter` entry: the converter's config
        and `check_predict`'s result.

    Raises:
        UsageError: no image converter.
        ValidationFailed: the file fails its validation, or differs from
            `task.predict` on raw images; nothing is placed.
    """
    output, options = Path(output), checked_options(options)
    if isinstance(task_model, str | Path):
        task_model = loading.load(task_model, imports=options.imports, unsafe=options.unsafe).model
    model = with_image_converter(task_model)
    targets = placement.Targets(
        onnx=output, report=options.report_path or placement.default_report_path(output)
    )
    placement.check_targets(targets, None)
    with placement.staging_folder(output) as folder:
        staged = folder / output.name  # its data file, if any, named as it will be placed
        inner = replace(options, report_path=folder / "inner.report.json", preprocessor=False)
        report = export_model(model, staged, inner)
        found = check_predict(task_model, staged, options.atol, options.rtol)
        converter = image_converter(task_model).get_config()
        report["image_converter"] = {
            "config": {k: v for k, v in converter.items() if k not in ("dtype", "trainable")},
            "predict": found,
        }
        report["report_path"] = str(targets.report)
        report["onnx_path"] = str(output)
        if not found["passed"]:
            report["passed"] = False
            raise ValidationFailed(
                f"the file differs from {type(task_model).__name__}.predict on raw images by "
                f"{found['max_abs_diff']:.3g} (sizes {', '.join(found['sizes'])}), beyond the "
                "tolerances. Nothing was placed.",
                report,
            )
        placement.write_json(report, folder / "report.json")
        moves = [(path, output.parent / path.name) for path in folder.iterdir()]
        moves = [(a, b) for a, b in moves if a.name not in ("report.json", "inner.report.json")]
        with placement.output_lock(output):
            placement.place([*moves, (folder / "report.json", targets.report)])
    return report
