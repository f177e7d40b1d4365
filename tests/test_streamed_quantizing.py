"""The streamed int4 export of a causal LM stored in half precision.

A keras-hub Llama 3 built in bfloat16 (tokenizer and preprocessor included)
is saved, then exported to an int4 folder twice: through float32 (the model
widened, the float decoder exported and checked, ONNX Runtime's
`MatMulNBitsQuantizer` run on the whole file) and streamed (the model held in
bfloat16, each weight quantized on its own). The oracle is the first: the
streamed folder's quantized weights must be byte for byte its weights, and
its gate's figures its figures. Peak memory is measured, not asserted, by
`benchmarks/big_model.py --streamed`.
"""

import collections
import hashlib
import shutil

import keras
import keras_hub
import numpy as np
import onnx
import pytest
import zoo_tokenizers
from onnx import numpy_helper

from benchmarks import int4_grid
from keras_layers.export import export_model, genai_folder, loading, memory, streamed_quantizing
from keras_layers.export.errors import UsageError
from keras_layers.export.options import ExportOptions
from keras_layers.export.passes import weight_views

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.xdist_group("streamed"),  # module fixtures: one worker (loadgroup)
]

# A tiny random model's greedy tokens barely survive 4 bits: the gate is
# opened here, and the test compares the two exports' figures instead.
OPEN_GATE = {"decoder_min_agreement": 0.0, "decoder_max_nll_change": 10.0}
# A model without preprocessor has no end id, and rotary positions no
# length: any id, and a context that holds the gate's 48 held-out ids.
ROTARY_IDS_FOLDER = {"end_token_id": 0, "context_length": 64}


def _bf16_llama3(vocabulary: int, hidden_dim: int):
    """A keras-hub Llama 3 backbone in bfloat16: 2 layers, 4 query and 2
    key/value heads, the intermediate width twice `hidden_dim`."""
    return keras_hub.models.Llama3Backbone(
        vocabulary_size=vocabulary,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=hidden_dim,
        intermediate_dim=2 * hidden_dim,
        dtype="bfloat16",
    )


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory):
    """The path of a tiny keras-hub Llama 3 causal LM saved in bfloat16."""
    keras.utils.set_random_seed(3)
    tokenizer = zoo_tokenizers.build("Llama3Tokenizer")
    backbone = _bf16_llama3(tokenizer.vocabulary_size(), hidden_dim=64)
    preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(tokenizer, sequence_length=32)
    lm = keras_hub.models.Llama3CausalLM(backbone, preprocessor=preprocessor)
    path = tmp_path_factory.mktemp("bf16") / "llama3.keras"
    lm.save(path)
    return path


@pytest.fixture(scope="module")
def both_folders(bf16_llama, tmp_path_factory):
    """(float32 path's report and folder, streamed path's report and folder).
    The streamed export is written over a copy of the float32 folder, as a
    user re-exports into the same folder (none of the float files may stay)."""
    root = tmp_path_factory.mktemp("folders")
    made = []
    for dtype in ("float32", "keep"):
        folder = root / dtype
        if dtype == "keep":
            shutil.copytree(root / "float32", folder, symlinks=True)
        options = ExportOptions(quantize="int4", weights_dtype=dtype, **OPEN_GATE)
        report = export_model(bf16_llama, f"{folder}/", options, task="causal-lm")
        made.append((report, folder))
    return made


def _quantized_weights(path) -> collections.Counter:
    """Each MatMulNBits' (K, N, weight bytes, scale bytes), as a multiset."""
    proto = onnx.load(path)
    initializers = {init.name: init for init in proto.graph.initializer}
    found = collections.Counter()
    for node in proto.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        sizes = tuple(a.i for a in node.attribute if a.name in ("K", "N"))
        blobs = tuple(
            hashlib.sha256(numpy_helper.to_array(initializers[name]).tobytes()).hexdigest()
            for name in node.input[1:]
        )
        found[sizes + blobs] += 1
    return found


def _needs(path) -> tuple:
    """(stored bytes, float32 bytes, the float32 export's estimate, the
    streamed export's), from `memory`'s figures, computed here (the
    archive's assets, its tokenizer's vocabulary, count in both)."""
    stored = memory.estimated_param_bytes(path, stored=True)
    widened = memory.estimated_param_bytes(path)
    assets = memory.ASSET_PEAK_PER_BYTE * memory.archive_asset_bytes(path)
    float_need = memory.BASELINE_BYTES + memory.PEAK_PER_PARAM_BYTE * widened + assets
    stream_need = memory.BASELINE_BYTES + memory.STREAMED_PEAK_PER_STORED_BYTE * stored + assets
    return stored, widened, float_need, stream_need


def test_stored_precision_holds_half_weights_and_computes_as_the_widened_model(bf16_llama):
    widened = loading.load(bf16_llama)
    stored = loading.load(bf16_llama, stored=True)
    assert {str(v.dtype) for v in stored.model.weights} == {"bfloat16"}
    assert {str(v.dtype) for v in widened.model.weights} == {"float32"}
    assert stored.param_bytes * 2 == widened.param_bytes
    # The archive's declared sizes (read before loading) count the same widening.
    declared = [memory.estimated_param_bytes(bf16_llama, stored=keep) for keep in (True, False)]
    assert declared[1] - declared[0] == widened.param_bytes - stored.param_bytes
    ids = np.array([[5, 9, 2, 14, 7]], "int32")
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    ours = keras.ops.convert_to_numpy(stored.model(inputs))
    oracle = keras.ops.convert_to_numpy(widened.model(inputs))
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, oracle)  # widening bfloat16 is exact


def test_the_streamed_folder_holds_the_float32_quantizers_weights_byte_for_byte(both_folders):
    (float_report, float_folder), (report, folder) = both_folders
    assert "streamed" in report and "streamed" not in float_report
    ours = _quantized_weights(folder / "int4" / "model.onnx")
    oracle = _quantized_weights(float_folder / "int4" / "model.onnx")
    assert sum(ours.values()) == 15  # 2 layers x 7 projections, and the output
    assert ours == oracle
    gate, oracle_gate = (r["folder"]["quantized"]["int4"] for r in (report, float_report))
    for figure in ("greedy_agreement", "mean_abs_log_prob_change", "genai_agreement"):
        assert gate[figure] == oracle_gate[figure], figure
    assert gate["quantized"] == oracle_gate["quantized"] == 15


def test_a_tied_output_projection_is_quantized_as_the_float32_path_does(tmp_path):
    """GPT-2 reads its embedding table twice: the lookup, and the output
    projection through a `Transpose`. The streamed export quantizes that
    projection from the transposed table, once, as `quantize_weights` does."""
    keras.utils.set_random_seed(4)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=96,
        num_layers=1,
        num_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=32,
        dtype="bfloat16",
    )
    path = tmp_path / "gpt2.keras"
    keras_hub.models.GPT2CausalLM(backbone, preprocessor=None).save(path)
    found = []
    for dtype in ("float32", "keep"):
        options = ExportOptions(quantize="int4", weights_dtype=dtype, end_token_id=0, **OPEN_GATE)
        genai_folder.export_folder(path, tmp_path / dtype, options)
        found.append(_quantized_weights(tmp_path / dtype / "int4" / "model.onnx"))
    assert sum(found[1].values()) == 7  # 6 projections, and the tied output
    assert found[1] == found[0]


def test_the_streamed_folder_is_what_genai_runs_and_nothing_else(both_folders):
    """Written over the float folder, the streamed folder shows only its int4
    folder and report: the float decoder, config and tokenizer files went
    with the switch (issue #45, item 17: they stayed beside the new report)."""
    (_, float_folder), (report, folder) = both_folders
    visible = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert visible == ["int4", "report.json"]
    inside = {p.name for p in (folder / "int4").iterdir()}
    float_inside = {p.name for p in (float_folder / "int4").iterdir()}
    assert inside == float_inside | {"model.onnx.data"}
    assert report["onnx_path"] == str(folder / "int4" / "model.onnx")
    proto = onnx.load(folder / "int4" / "model.onnx", load_external_data=False)
    dtypes = {init.data_type for init in proto.graph.initializer}
    assert onnx.TensorProto.FLOAT16 not in dtypes  # no float16 anywhere
    # The one weight left in bfloat16 is the embedding table, behind the Cast
    # its lookup reads (ONNX Runtime folds it when the session starts).
    halves = [i for i in proto.graph.initializer if i.data_type == onnx.TensorProto.BFLOAT16]
    assert len(halves) == 1 and halves[0].dims[1] == 64
    (cast,) = [n for n in proto.graph.node if halves[0].name in n.input]
    assert cast.op_type == "Cast"
    assert [n.op_type for n in proto.graph.node if cast.output[0] in n.input] == ["Gather"]
    assert report["folder"]["quantized"]["int4"]["genai_agreement"] is not None


def test_a_changed_block_size_fails_the_byte_comparison(
    bf16_llama, both_folders, tmp_path, monkeypatch
):
    """Prove the proof: with blocks of 64, not the 32 of
    `quantizing.quantize_weights`, every quantized weight differs."""
    monkeypatch.setattr(streamed_quantizing, "BLOCK_SIZE", 64)
    options = ExportOptions(quantize="int4", weights_dtype="keep", **OPEN_GATE)
    genai_folder.export_folder(bf16_llama, tmp_path / "b64", options)
    ours = _quantized_weights(tmp_path / "b64" / "int4" / "model.onnx")
    oracle = _quantized_weights(both_folders[0][1] / "int4" / "model.onnx")
    assert sum(ours.values()) == 15 and not ours & oracle
    blocks = onnx.load(tmp_path / "b64" / "int4" / "model.onnx", load_external_data=False)
    sizes = {a.i for n in blocks.graph.node for a in n.attribute if a.name == "block_size"}
    assert sizes == {64}


@pytest.fixture(scope="module")
def grid_llama(tmp_path_factory):
    """A tiny keras-hub Llama 3 in bfloat16 whose matrices 4 bits hold
    exactly (`benchmarks/int4_grid.py`), with block scales that differ."""
    backbone = _bf16_llama3(256, hidden_dim=128)
    int4_grid.redraw(backbone, np.random.default_rng(5))
    path = tmp_path_factory.mktemp("grid") / "llama3.keras"
    keras_hub.models.Llama3CausalLM(backbone, preprocessor=None).save(path)
    return path


def _streamed_on_grid(path, folder, **gate) -> dict:
    """The int4 gate's figures of `path` streamed at accuracy level 1 (the
    gate at its defaults, or `gate`); and every MatMulNBits' accuracy level."""
    options = ExportOptions(
        quantize="int4", weights_dtype="keep", decoder_accuracy_level=1, **ROTARY_IDS_FOLDER, **gate
    )
    report = genai_folder.export_folder(path, folder, options)
    proto = onnx.load(folder / "int4" / "model.onnx", load_external_data=False)
    levels = [a.i for n in proto.graph.node for a in n.attribute if a.name == "accuracy_level"]
    return {**report["folder"]["quantized"]["int4"], "levels": levels}


def test_weights_on_the_int4_grid_come_out_of_the_streamed_folder_as_keras_computes(
    grid_llama, tmp_path
):
    """4 bits lose nothing of these weights, and level 1 computes in float32:
    the folder's greedy tokens are Keras' and its log-probabilities Keras' up
    to float rounding. A block, scale or layout the quantizer got wrong
    would move them as far as a random model's 4 bits do (0.07 nats)."""
    gate = _streamed_on_grid(grid_llama, tmp_path / "grid")
    assert gate["levels"] == [1] * 15 and gate["accuracy_level"] == 1
    assert gate["quantized"] == 15
    assert gate["greedy_agreement"] == 1.0
    assert gate["mean_abs_log_prob_change"] < 1e-5


def test_blocks_of_64_lose_the_grid_weights(grid_llama, tmp_path, monkeypatch):
    """Prove the proof: blocks of 64 join two blocks of different scales, and
    the log-probabilities move a hundred times past the bound above (the
    gate opened: which greedy near-ties of a random model flip is not the
    point)."""
    monkeypatch.setattr(streamed_quantizing, "BLOCK_SIZE", 64)
    gate = _streamed_on_grid(grid_llama, tmp_path / "b64", **OPEN_GATE)
    assert gate["mean_abs_log_prob_change"] > 1e-3, gate["mean_abs_log_prob_change"]


def test_the_memory_check_streams_when_float32_cannot_fit(bf16_llama, monkeypatch):
    """float32 needs 2x the stored bytes: a limit between the two estimates
    chooses streaming; one under both refuses with both figures."""
    stored, widened, float_need, stream_need = _needs(bf16_llama)
    assert stream_need < float_need
    options = ExportOptions(quantize="int4")
    between = memory.Limit("a test limit", int((float_need + stream_need) / 2))
    monkeypatch.setattr(memory, "limits", lambda: [between])
    assert genai_folder.streams(bf16_llama, options)
    assert not genai_folder.streams(bf16_llama, ExportOptions(quantize="int4", memory_check=False))
    with pytest.raises(UsageError, match="needs about"):
        genai_folder.streams(bf16_llama, ExportOptions())  # no quantize: nothing to stream
    under = memory.Limit("a test limit", int(stream_need / 2))
    monkeypatch.setattr(memory, "limits", lambda: [under])
    with pytest.raises(UsageError) as refused:
        genai_folder.streams(bf16_llama, options)
    message = str(refused.value)
    assert f"{widened / 1e9:.2f} GB of weights" in message
    assert "streamed from its stored weights, exporting this model needs about" in message
    assert f"{stored / 1e9:.2f} GB of weights" in message


def test_the_streamed_export_chosen_by_memory_never_widens_a_matrix(
    bf16_llama, both_folders, tmp_path, monkeypatch
):
    """Chosen by the memory check (weights_dtype left at float32), the export
    still keeps every matrix in bfloat16: no 2-D float32 values are written to
    the data file, and the quantized weights are the float32 path's."""
    _, _, float_need, stream_need = _needs(bf16_llama)
    between = memory.Limit("a test limit", int((float_need + stream_need) / 2))
    monkeypatch.setattr(memory, "limits", lambda: [between])
    written = []
    replace = weight_views.weights.replace

    def spy(tensor, array, folder):
        written.append((array.dtype, array.ndim))
        return replace(tensor, array, folder)

    monkeypatch.setattr(weight_views.weights, "replace", spy)
    report = genai_folder.export_folder(
        bf16_llama, tmp_path / "auto", ExportOptions(quantize="int4", **OPEN_GATE)
    )
    assert "streamed" in report
    assert written and (np.dtype("float32"), 2) not in written
    ours = _quantized_weights(tmp_path / "auto" / "int4" / "model.onnx")
    assert ours == _quantized_weights(both_folders[0][1] / "int4" / "model.onnx")


def test_keep_with_quantize_is_refused_for_a_file(bf16_llama, tmp_path):
    options = ExportOptions(quantize="int8", weights_dtype="keep")
    with pytest.raises(UsageError, match="streams a causal LM's stored weights"):
        export_model(bf16_llama, tmp_path / "out.onnx", options)
    with pytest.raises(UsageError, match="weights_dtype='float16'"):
        ExportOptions(quantize="int4", weights_dtype="float16")


def test_an_accuracy_level_is_refused_where_no_matmulnbits_is_written(bf16_llama, tmp_path):
    with pytest.raises(UsageError, match="only with quantize"):
        ExportOptions(decoder_accuracy_level=1)
    with pytest.raises(UsageError, match="give one of 1, 4"):
        ExportOptions(quantize="int4", decoder_accuracy_level=2)
    options = ExportOptions(quantize="int8", decoder_accuracy_level=1)
    with pytest.raises(UsageError, match="quantized dynamically"):
        export_model(bf16_llama, tmp_path / "out.onnx", options)
    assert not list(tmp_path.iterdir())
