"""Inputs that public Keras code shapes in ways our own models do not (#45, 3b).

Three keras.io examples, as tests/conformance/ adapts them, exported from
their `.keras` files, and for each a wrong file that the checks passed
before and must fail now:

- the Switch Transformer runs at its training batch only, and its token ids
  come in as float32: the role probe retries at the caller's grid (and says
  so), and the ids it finds are fed as ids, so an embedding table off by 5%
  beyond its first rows fails;
- the video Transformer declares `keras.Input(shape=(None, None))` and masks
  all-zero frames in a `compute_mask` of its own: the frames are fed at the
  width its weights hold, padding frames are zeros at the padded point, and
  a file that drops the attention's mask fails;
- the character-level LSTM seq2seq takes two one-hot inputs that Keras runs
  at unequal lengths: each gets its own axis, and a file whose output takes
  the encoder's length fails.
"""

import json

import mutants
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from keras_layers.export import ExportOptions, ValidationFailed, export_model, loading, validate
from tests.conformance import lstm_seq2seq, switch_transformer, video_transformer

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.filterwarnings("ignore::UserWarning:keras.*"),
]

SWITCH = "tests.conformance.switch_transformer"
VIDEO = "tests.conformance.video_transformer"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each example saved, then exported from its file: name -> (model path,
    ONNX path, report, options)."""
    root = tmp_path_factory.mktemp("public")
    found = {}
    for name, module, options in (
        ("switch", switch_transformer, ExportOptions(imports=[SWITCH], shapes=[(5, 16)])),
        ("video", video_transformer, ExportOptions(imports=[VIDEO])),
        ("seq2seq", lstm_seq2seq, ExportOptions()),
    ):
        path = root / f"{name}.keras"
        module.build().save(path)
        report = export_model(path, root / f"{name}.onnx", options)
        found[name] = (path, root / f"{name}.onnx", report, options)
    return found


def _fails(model_path, onnx_path, options) -> str:
    with pytest.raises(ValidationFailed) as failed:
        validate(model_path, onnx_path, options)
    return json.dumps(failed.value.report["checks"])


def _rewritten(source, target, change) -> None:
    proto = onnx.load(str(source))
    change(proto.graph)
    onnx.save_model(proto, str(target))


def test_a_model_of_one_batch_size_is_probed_at_the_grid_and_says_so(exported, tmp_path):
    model_path, _, report, _ = exported["switch"]
    (ids,) = report["inputs"]
    assert (ids["role"], ids["vocabulary"]) == ("ids", switch_transformer.vocab_size)
    assert any("role probe ran at 5x16 after failing at 2x16" in w for w in report["warnings"])
    # Without the grid the probe fails everywhere: said, never silent.
    alone = loading.load(model_path, imports=[SWITCH])
    assert any("could not run the model" in note and "--shapes" in note for note in alone.notes)


def test_an_embedding_off_beyond_its_first_rows_fails_float_ids(exported, tmp_path):
    model_path, onnx_path, _, options = exported["switch"]

    def scale_rows(graph):
        (table,) = [
            t for t in graph.initializer if tuple(t.dims) == (switch_transformer.vocab_size, 16)
        ]
        values = numpy_helper.to_array(table).copy()
        values[8:-11] *= 1.05  # ids -11..7 (random floats cast) read none of them
        table.CopyFrom(numpy_helper.from_array(values, table.name))

    wrong = tmp_path / "rows_scaled.onnx"
    _rewritten(onnx_path, wrong, scale_rows)
    _fails(model_path, wrong, options)


def test_free_feature_width_is_read_from_the_weights(exported):
    model_path, _, report, _ = exported["video"]
    (frames,) = report["inputs"]
    assert frames["masks_zero"] and frames["role"] == "features"
    assert any("fed 32" in w for w in report["warnings"])
    loaded = loading.load(model_path, imports=[VIDEO])
    assert loaded.inputs[0].widths == (video_transformer.NUM_FEATURES,)


def test_a_mask_over_float_frames_gets_padded_frames(exported, tmp_path):
    model_path, onnx_path, report, options = exported["video"]
    assert "padded" in [check["shape"] for check in report["checks"]]
    loaded = loading.load(model_path, imports=[VIDEO])
    from keras_layers.export import validating

    feeds = validating.make_inputs(loaded, "padded", np.random.default_rng(0))
    (frames,) = feeds.values()
    assert frames.shape[2] == video_transformer.NUM_FEATURES
    real = (frames != 0).any(axis=-1)
    assert real.sum(axis=1).tolist() == [8, 5, 1, 4, 0]
    mutant = mutants.BY_NAME["mask_ignored"].apply(onnx.load(str(onnx_path)))
    assert mutant.applied, mutant.reason
    wrong = mutants.save(mutant, tmp_path / "mask_ignored.onnx", onnx_path)
    assert "padded" in _fails(model_path, wrong, options)


def test_two_sequences_keras_runs_apart_get_axes_of_their_own(exported):
    _, _, report, _ = exported["seq2seq"]
    encoder, decoder = report["inputs"]
    assert encoder["shape"][1] != decoder["shape"][1]
    assert report["shared_axes"] == {}
    (output,) = report["outputs"]
    assert output["shape"][1] == decoder["shape"][1]


def test_an_output_that_takes_the_encoders_length_fails(exported, tmp_path):
    model_path, onnx_path, _, options = exported["seq2seq"]

    def encoders_length(graph):
        encoder, decoder = (value.name for value in graph.input[:2])
        (output,) = graph.output
        inner = f"{output.name}_decoder"
        for node in graph.node:
            node.output[:] = [inner if name == output.name else name for name in node.output]
        one = numpy_helper.from_array(np.array([1], np.int64), "one")
        zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
        step = numpy_helper.from_array(np.array(1, np.int64), "step")
        graph.initializer.extend([one, zero, step])
        graph.node.extend(
            [
                helper.make_node("Shape", [encoder], ["enc_len"], start=1, end=2),
                helper.make_node("Shape", [decoder], ["dec_len"], start=1, end=2),
                helper.make_node("Squeeze", ["enc_len"], ["enc_scalar"]),
                helper.make_node("Range", ["zero", "enc_scalar", "step"], ["steps"]),
                helper.make_node("Sub", ["dec_len", "one"], ["last"]),
                helper.make_node("Min", ["steps", "last"], ["index"]),
                helper.make_node("Gather", [inner, "index"], [output.name], axis=1),
            ]
        )

    wrong = tmp_path / "encoders_length.onnx"
    _rewritten(onnx_path, wrong, encoders_length)
    _fails(model_path, wrong, options)
