"""Detections compared after the model's own decoding.

A keras-hub object detector (`RetinaNetObjectDetector`,
`DFineObjectDetector`) computes raw outputs in its call (box regressions
and class logits per anchor or query), which is what the ONNX file holds;
its `predict` then decodes them with `decode_predictions(outputs, images)`:
the boxes from the anchors and the image size, then non-maximum suppression
keeps the confident ones. The raw outputs can agree within the tolerance and
the detections a user sees still differ (a box that crosses the confidence
threshold, a suppression that goes the other way), and they can differ where
the raw comparison hides it (one anchor among thousands). So the forward
task decodes both sides with the model's own decoder, at every grid point,
and compares what a user gets:

- the number of detections of each image;
- each Keras detection matched to an ONNX one of the same class, its box
  within the tolerance (atol times the boxes' spread, as raw values are
  compared, plus rtol times the coordinate; a coordinate that overflows, as
  a random model's do, must overflow alike) and its score within atol; as
  sets, since suppression may order equal scores either way;
- a detection on one side only is allowed where its score is within
  `THRESHOLD_MARGIN` of the decoder's confidence threshold, where rounding
  may legitimately put it on either side.

Where Keras' own detections are no boxes (a coordinate not finite, or
`OVERFLOW` times past the image: an untrained model's box deltas go through
`exp`), the point's check passes with a problem saying it compared nothing:
the raw outputs' checks still hold there.

The check is one per grid point, output `detections`: `compare` gives its
fields, `validating.Check`'s.
"""

import numpy as np

from keras_layers.export import images

OUTPUT = "detections"
# How near the confidence threshold a detection may be found on one side only.
THRESHOLD_MARGIN = 1e-3
# Boxes this many times past the image's side are no detections (`_overflow`).
OVERFLOW = 100


def decoder(model):
    """The model's own decoding, or `None` for a model that does not decode.

    Args:
        model: the Keras model.

    Returns:
        `decode(outputs, images) -> {"boxes", "confidence", "labels",
        "num_detections"}` as NumPy arrays, or `None`.
    """
    import keras

    decode = getattr(model, "decode_predictions", None)
    if not callable(decode) or getattr(model, "prediction_decoder", None) is None:
        return None

    def run(outputs: dict, images: np.ndarray) -> dict:
        found = decode({k: keras.ops.convert_to_tensor(v) for k, v in outputs.items()}, images)
        return {k: np.asarray(keras.ops.convert_to_numpy(v)) for k, v in found.items()}

    return run


def threshold(model) -> float | None:
    """The confidence threshold of the model's decoder, where it has one."""
    return getattr(getattr(model, "prediction_decoder", None), "confidence_threshold", None)


def _fields(label, worst, passed, problem, scale=None, bound=None) -> dict:
    return {
        "shape": label,
        "output": OUTPUT,
        "max_abs_diff": worst,
        "max_rel_diff": 0.0,
        "passed": passed,
        "problem": problem,
        "scale": scale,
        "max_scaled_diff": worst if scale is not None else None,
        "bound": bound,
    }


def _overflow(found: dict, side) -> str | None:
    """Why Keras' own detections are no boxes, or `None`: a coordinate that is
    not finite, or `OVERFLOW` times past the image (an untrained model's box
    deltas go through `exp`, and any rounding is amplified past comparing)."""
    boxes = np.asarray(found["boxes"], "float64")
    counts = np.asarray(found["num_detections"]).astype(int)
    kept = np.concatenate([boxes[i, : counts[i]].ravel() for i in range(len(counts))] or [[]])
    if not kept.size:
        return None
    if not np.isfinite(kept).all():
        return "Keras' own boxes are not finite (box deltas overflow, as untrained weights give)"
    largest = float(np.max(np.abs(kept)))
    if side and largest > OVERFLOW * side:
        return (
            f"Keras' own boxes reach {largest:.3g}, past {OVERFLOW} times the image's side "
            "(box deltas overflow, as untrained weights give)"
        )
    return None


def _box_difference(box: np.ndarray, other: np.ndarray) -> float:
    """The largest coordinate difference; infinite unless the two boxes'
    non-finite coordinates (a random model's boxes overflow) are the same."""
    finite = np.isfinite(box)
    if not np.array_equal(finite, np.isfinite(other)):
        return float("inf")
    if not np.array_equal(box[~finite], other[~finite], equal_nan=True):
        return float("inf")
    return float(np.max(np.abs(other[finite] - box[finite]), initial=0.0))


def _at_threshold(score: float, threshold) -> bool:
    return threshold is not None and abs(score - threshold) <= THRESHOLD_MARGIN


def _detections(found: dict, image: int) -> list:
    boxes, labels = found["boxes"][image], found["labels"][image]
    scores = found["confidence"][image]
    count = int(found["num_detections"][image])
    return [(boxes[i], float(scores[i]), int(labels[i])) for i in range(count)]


def compare(
    label: str, keras_found: dict, onnx_found: dict, atol: float, rtol: float, at=None, side=None
):
    """One grid point's detections, Keras' against the file's.

    Args:
        label: the grid point's label.
        keras_found: Keras' decoded detections (`decoder`).
        onnx_found: the file's outputs decoded the same way.
        atol: absolute tolerance (boxes: times their spread).
        rtol: relative tolerance of box coordinates.
        at: the decoder's confidence threshold (`threshold`), or `None`.
        side: the image's larger side, in pixels.

    Returns:
        The fields of a `validating.Check` of output `detections`: the
        largest box difference, passed or not, and the first problem found.
    """
    overflow = _overflow(keras_found, side)
    if overflow is not None:  # nothing a user could be given: nothing to compare
        return _fields(label, 0.0, True, f"not compared: {overflow}")
    boxes = keras_found["boxes"][np.isfinite(keras_found["boxes"])].astype("float64")
    spread = max(1.0, float(np.std(boxes))) if boxes.size else 1.0
    worst, problems = 0.0, []
    for image in range(len(keras_found["num_detections"])):
        expected, got = _detections(keras_found, image), _detections(onnx_found, image)
        unmatched = list(range(len(got)))
        for box, score, cls in sorted(expected, key=lambda d: -d[1]):
            best, best_diff = None, None
            for j in unmatched:
                other, other_score, other_cls = got[j]
                diff = _box_difference(box, other)
                bound = atol * spread + rtol * float(
                    np.max(np.abs(box[np.isfinite(box)]), initial=0)
                )
                if other_cls == cls and abs(other_score - score) <= atol and diff <= bound:
                    if best is None or diff < best_diff:
                        best, best_diff = j, diff
            if best is not None:
                unmatched.remove(best)
                worst = max(worst, best_diff)
            elif not _at_threshold(score, at):
                problems.append(
                    f"image {image}: Keras detects class {cls} (score {score:.4f}, box "
                    f"{np.round(box, 3).tolist()}) that the file does not"
                )
        for j in unmatched:
            _, score, cls = got[j]
            if not _at_threshold(score, at):
                problems.append(
                    f"image {image}: the file detects class {cls} (score {score:.4f}) that "
                    "Keras does not"
                )
    first = problems[0] if problems else None
    return _fields(label, worst, not problems, first, spread, atol * spread)


def checker(loaded, atol: float, rtol: float):
    """The validation's hook (`validating.validate`'s `decode`) for a model
    that decodes its outputs, or `None`.

    Args:
        loaded: the loaded model (`loading.LoadedModel`); its first image
            input is what the decoder reads the image size from.
        atol: absolute tolerance.
        rtol: relative tolerance.

    Returns:
        `check(label, feeds, keras_outputs, file_outputs) -> dict` (`compare`),
        or `None` when the model does not decode, has no image input, or was
        released.
    """
    model = loaded.model
    decode = decoder(model) if model is not None else None
    pictures = [info.name for info in loaded.inputs if images.is_image(info)]
    if decode is None or not pictures:
        return None
    at = threshold(model)

    def check(label: str, feeds: dict, expected: dict, got: dict):
        image = feeds[pictures[0]]
        side = max(image.shape[1:3])  # NHWC, as keras-hub's detectors take them
        return compare(label, decode(expected, image), decode(got, image), atol, rtol, at, side)

    return check
