"""`--task causal-lm`: decoders exported with a key/value cache, checked against Keras.

Oracles independent of the export's own checks: keras-hub's compiled
`CausalLM.generate` (greedy sampler) for keras-hub models, a greedy loop
written here that recomputes the whole sequence in Keras for our decoder, and
TensorFlow's own `XlaDynamicUpdateSlice` for the op handler the cache needs.
"""

import json
import subprocess
import sys

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from keras_layers.export import (
    ExportError,
    ExportOptions,
    UsageError,
    ValidationFailed,
    causal_lm,
    export_model,
    genai_folder,
    generate,
    generation,
)
from keras_layers.export.generation import CachedDecoder
from tests import mutants, zoo_models

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.xdist_group("causal_lm"),  # module fixtures: one worker (loadgroup)
]

VOCAB = 97
PROMPT_LENGTHS = (6, 3, 9)
NEW_TOKENS = 12


def keras_hub_lm(kind: str, seed: int = 0):
    """A tiny keras-hub causal LM, every float weight redrawn."""
    import keras_hub

    keras.utils.set_random_seed(0)
    common = {"vocabulary_size": VOCAB, "num_layers": 2, "hidden_dim": 32, "intermediate_dim": 64}
    if kind == "gpt2":
        backbone = keras_hub.models.GPT2Backbone(num_heads=4, max_sequence_length=64, **common)
        model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    elif kind == "llama":  # grouped-query attention, rotary positions, RMSNorm
        backbone = keras_hub.models.LlamaBackbone(
            num_query_heads=4, num_key_value_heads=2, **common
        )
        model = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    else:  # gemma: one key/value head, a head size of its own, tied logits
        backbone = keras_hub.models.GemmaBackbone(
            num_query_heads=4, num_key_value_heads=1, head_dim=16, **common
        )
        model = keras_hub.models.GemmaCausalLM(backbone, preprocessor=None)
    return zoo_models.redraw(model, seed)


def prompts(lengths=PROMPT_LENGTHS, seed=3):
    """Right-padded prompts of different lengths and their padding mask."""
    rng = np.random.default_rng(seed)
    mask = np.arange(max(lengths)) < np.array(lengths)[:, None]
    return np.where(mask, rng.integers(1, VOCAB, mask.shape), 0).astype("int32"), mask


def keras_hub_greedy(model, ids, mask, new_tokens):
    """keras-hub's own compiled generation, greedy, to the same length."""
    model.compile(sampler="greedy")
    total = ids.shape[1] + new_tokens
    padded = np.zeros((ids.shape[0], total), "int32")
    padded[:, : ids.shape[1]] = ids
    full_mask = np.zeros((ids.shape[0], total), bool)
    full_mask[:, : ids.shape[1]] = mask
    out = model.generate({"token_ids": padded, "padding_mask": full_mask}, stop_token_ids=None)
    return np.asarray(out["token_ids"])


# GPT-2 in the default suite; Llama (grouped-query, rotary) and Gemma (soft-cap,
# scaled input) under -m slow, which CI runs: 20 s of export each.
@pytest.fixture(
    scope="module",
    params=["gpt2", *(pytest.param(name, marks=pytest.mark.slow) for name in ("llama", "gemma"))],
)
def exported(request, tmp_path_factory):
    model = keras_hub_lm(request.param)
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.onnx"
    report = export_model(model, path, task="causal-lm")
    return model, path, report


def test_a_keras_hub_decoder_exports_with_its_cache_and_passes_every_check(exported):
    model, path, report = exported
    assert report["passed"]
    labels = [check["shape"] for check in report["checks"]]
    assert labels[0].startswith("prompt ")
    assert labels[1].startswith(f"decode steps 1-{causal_lm.DECODE_STEPS} ")
    # Each greedy batch in lockstep, then right- and left-padded with a mask:
    # the tokens, and the logits that chose them against each row alone.
    assert [label.split()[0] for label in labels[2:]] == ["greedy"] * 10
    padded = [(c["shape"].split(", ")[-1], c["output"]) for c in report["checks"][3:7]]
    assert padded == [
        (f"{side}-padded with attention_mask", output)
        for side in ("right", "left")
        for output in ("greedy tokens", "logits")
    ]
    names = [entry["name"] for entry in report["inputs"]]
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert names[3:] == causal_lm.Decoder(2, 1, 1, "float32", VOCAB).cache_names("past_key_values")
    assert report["inputs"][1]["shape"] == ["batch", "total_sequence"]
    assert report["inputs"][3]["shape"][2] == "past_sequence"
    assert report["outputs"][1]["shape"][2] == "total_sequence"
    # Each layer's cache is picked out of keras-hub's stacked cache without a copy.
    assert report["graph"]["stack_picks_folded"] >= 2


def test_each_cached_attention_is_one_group_query_attention_writing_its_present(exported):
    """Every layer's attention becomes ONNX Runtime's `GroupQueryAttention`
    (passes.fusions.group_query_attention), which writes the present itself:
    no other node reads the past, so genai may pass one preallocated buffer as
    past and present. `MultiHeadAttention` leaves a cached decoder alone."""
    model, path, report = exported
    graph, layers = report["graph"], model.backbone.num_layers
    assert graph["fused"]["GroupQueryAttention"] == layers
    assert graph["fused"]["MultiHeadAttention"] == 0
    assert "GroupQueryAttention" not in graph["declined"]
    proto = onnx.load(path)
    makers = {
        node.op_type for node in proto.graph.node for name in node.output if "present" in name
    }
    assert makers == {"GroupQueryAttention"}
    # Gemma's zeroing of rows that see no key still reads the past's shape,
    # given the mask's width less the new tokens' (past_lengths_from_the_mask).
    assert genai_folder.why_no_shared_buffer(path) is None
    assert CachedDecoder(path).shares_buffer


def test_generate_writes_one_shared_cache_buffer_in_place_with_the_same_tokens(exported):
    """Where only GroupQueryAttention reads the past, `generate` binds one
    max-length buffer per cache as past and present (`SharedCache`): the
    tokens equal those of a new cache per step (and the export's greedy
    checks, which run `generate`, compare them with Keras)."""
    _, path, _ = exported
    decoder = CachedDecoder(path)
    assert decoder.shares_buffer
    ids = np.random.default_rng(5).integers(1, VOCAB, (3, 6))
    shared = generate(decoder, ids, 12)
    decoder.shares_buffer = False
    np.testing.assert_array_equal(generate(decoder, ids, 12), shared)
    buffers = generation.SharedCache(decoder, 3, 20)
    logits = buffers.step(ids.astype(decoder.ids_dtype))
    grown, cache = decoder.step(ids, decoder.empty_cache(3))
    np.testing.assert_allclose(logits, grown, rtol=1e-5, atol=1e-6)
    for name, value in buffers.buffers.items():  # written in place, the rest still zero
        written = value.numpy()
        np.testing.assert_allclose(written[:, :, :6], cache[name], rtol=1e-6, atol=1e-7)
        assert not written[:, :, 6:].any()


def test_rotary_embeddings_are_fused_with_the_cache_offset_inside_their_angles(exported):
    """Llama and Gemma turn each query and key by its position past the cache
    (fusions.rotary); GPT-2 has learned positions and nothing to fuse. That the
    offset is right is what the prompt, decode-step and greedy checks prove."""
    model, path, report = exported
    rotations = 0 if type(model.backbone).__name__ == "GPT2Backbone" else 2
    expected = rotations * model.backbone.num_layers
    assert report["passed"] and report["graph"]["fused"]["RotaryEmbedding"] == expected
    assert [n.op_type for n in onnx.load(path).graph.node].count("RotaryEmbedding") == expected
    assert "RotaryEmbedding" not in report["graph"]["declined"]


def test_generated_tokens_are_keras_hubs_own_greedy_tokens(exported):
    """Against `CausalLM.generate`, compiled by keras-hub: a second
    implementation of padding, lockstep and the cached call."""
    model, path, _ = exported
    ids, mask = prompts()

    ours = generate(path, ids, NEW_TOKENS, padding_mask=mask)
    theirs = keras_hub_greedy(model, ids, mask, NEW_TOKENS)

    for row, length in enumerate(PROMPT_LENGTHS):
        end = length + NEW_TOKENS  # keras-hub also fills a shorter row further
        np.testing.assert_array_equal(ours[row, :end], theirs[row, :end])
        assert (ours[row, end:] == 0).all()


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_batch_generates_each_prompt_as_keras_hub_does_alone(exported, side):
    """onnxruntime-genai's way (and Hugging Face's): the padded batch in one
    call with `attention_mask` and `position_ids`, genai padding on the right,
    Hugging Face on the left. Each row must be keras-hub's compiled generate
    on that prompt alone, no padding anywhere."""
    model, path, _ = exported
    ids, mask = prompts()

    ours = generation.padded_greedy(CachedDecoder(path), ids, mask, NEW_TOKENS, side)

    for row, length in enumerate(PROMPT_LENGTHS):
        alone = ids[row : row + 1, :length]
        theirs = keras_hub_greedy(model, alone, np.ones_like(alone, bool), NEW_TOKENS)
        np.testing.assert_array_equal(ours[row, : length + NEW_TOKENS], theirs[0])


def _ignoring_the_mask(path, output):
    """The decoder with its attention_mask neutral in every attention, the
    causal term kept (tests/mutants.py)."""
    mutant = mutants.BY_NAME["mask_ignored"].apply(onnx.load(path))
    return mutants.save(mutant, output, path)


def test_a_decoder_that_ignores_its_attention_mask_fails_the_padded_checks(exported, tmp_path):
    """Prove the proof: the same decoder, its mask replaced by ones, still
    generates in lockstep (no padding there) and must fail every padded
    batch of different lengths."""
    model, path, _ = exported
    loaded = _loaded(model)
    reference = causal_lm.references(loaded, causal_lm.describe(loaded))
    broken = _ignoring_the_mask(path, tmp_path / "ignoring.onnx")

    checks = causal_lm.validate(reference, broken, 1e-4, 1e-3).checks

    failed = {check.shape for check in checks if not check.passed}
    sides = [f"4x(5,9,2,12)+32, {side}-padded with attention_mask" for side in ("right", "left")]
    assert failed == {f"greedy {label}" for label in sides}, failed


def test_the_cache_grows_by_the_tokens_fed_and_matches_keras_cached_call(exported):
    """The file's `present` caches are Keras' cache, transposed to (batch,
    heads, sequence, size), after a prompt and two single-token calls."""
    from keras import ops

    model, path, _ = exported
    decoder = CachedDecoder(path)
    ids, _ = prompts((5, 5))
    layers = len(decoder.cache_inputs) // 2
    heads, size = decoder.cache_inputs[0].heads, decoder.cache_inputs[0].head_size
    cache = ops.zeros((2, layers, 2, 7, heads, size))
    _, _, cache = model.call_with_cache(ids, cache, 0)
    logits, present = decoder.step(ids, decoder.empty_cache(2))
    for position in (5, 6):
        token = logits[:, -1].argmax(-1)[:, None].astype("int32")
        expected, _, cache = model.call_with_cache(token, cache, position)
        logits, present = decoder.step(token, present)
        np.testing.assert_allclose(logits, np.asarray(expected), atol=1e-4, rtol=1e-3)
    keras_cache = np.asarray(cache)
    for layer in range(layers):
        for kind, name in enumerate(("key", "value")):
            name = f"past_key_values.{layer}.{name}"
            assert present[name].shape == (2, heads, 7, size)
            expected = keras_cache[:, layer, kind].transpose(0, 2, 1, 3)
            np.testing.assert_allclose(present[name], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.slow  # minutes; CI runs the slow tier (.ci/run)
def test_our_decoder_exports_from_a_file_by_the_command(tmp_path):
    from keras_layers.demo import TiedDecoder

    model_path = tmp_path / "decoder.keras"
    keras.utils.set_random_seed(0)
    model = zoo_models.redraw(TiedDecoder(vocabulary=VOCAB, width=32, layers=2, dropout=0.1))
    model.save(model_path)
    output = tmp_path / "decoder.onnx"

    result = subprocess.run(
        [sys.executable, "export/to_onnx.py", str(model_path), "-o", str(output)]
        + ["--task", "causal-lm", "--import", "keras_layers.demo", "-q"],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "decoder.report.json").read_text())
    assert report["passed"] and len(report["checks"]) == 4
    ids, mask = prompts()
    ours = generate(output, ids, NEW_TOKENS, padding_mask=mask)
    np.testing.assert_array_equal(ours, recomputed_greedy(model, ids, mask, NEW_TOKENS))


def recomputed_greedy(model, ids, mask, new_tokens):
    """Greedy decoding written here: the whole sequence through `model(...)`
    at every step, one row at a time (no padding, no lockstep)."""
    out = np.zeros((ids.shape[0], ids.shape[1] + new_tokens), "int32")
    for row, length in enumerate(mask.sum(axis=1)):
        tokens = list(ids[row, :length])
        for _ in range(new_tokens):
            feed = np.array([tokens], "int32")
            logits = model({"token_ids": feed, "padding_mask": np.ones_like(feed)})
            tokens.append(int(np.argmax(np.asarray(logits)[0, -1])))
        out[row, : len(tokens)] = tokens
    return out


@pytest.mark.parametrize(
    "exported",
    [
        "gpt2",
        pytest.param("llama", marks=pytest.mark.slow),
        pytest.param("gemma", marks=pytest.mark.slow),
    ],
    indirect=True,
)
def test_a_file_that_generates_differently_fails_the_token_check(exported, tmp_path):
    """Keras' side from one model, the file from another of the same shape:
    the logits and the greedy tokens both fail, and the problem names the
    first differing token."""
    _, path, _ = exported
    loaded = _loaded(keras_hub_lm(path.stem, seed=7))
    decoder = causal_lm.describe(loaded)

    validation = causal_lm.validate(causal_lm.references(loaded, decoder), path, 1e-4, 1e-3)

    assert not validation.passed
    tokens = [check for check in validation.checks if check.output == "greedy tokens"]
    assert tokens and not any(check.passed for check in tokens)
    assert "first at row" in tokens[0].problem


def _loaded(model):
    from keras_layers.export import loading

    return loading.load(model)


@pytest.mark.parametrize(
    "positions, step_prompt, greedy, steps",
    [
        (None, (4, 9), ((7,), (5, 9, 2, 12)), 32),
        (64, (4, 9), ((7,), (5, 9, 2, 12)), 32),
        (24, (4, 9), ((7,), (5, 9, 2, 12)), 12),
        (13, (4, 6), ((6,), (5, 6, 2, 6)), 7),
        (12, (4, 6), ((6,), (5, 6, 2, 6)), 6),
        (2, (4, 1), ((1,), (1, 1, 1, 1)), 1),
    ],
)
def test_the_checks_fit_a_model_of_few_positions(positions, step_prompt, greedy, steps):
    """Prompts cut to half the positions, steps to what the longest prompt
    leaves: neither the step check nor a greedy batch feeds more positions
    than the model holds (docs/generation.md, "What the export checks")."""
    lengths = causal_lm.check_lengths(positions)
    assert (lengths.step_prompt, lengths.greedy, lengths.steps) == (step_prompt, greedy, steps)
    if positions is not None:
        assert lengths.step_prompt[1] + lengths.steps <= positions
        assert max(map(max, lengths.greedy)) + lengths.steps - 1 <= positions


def test_a_model_of_one_position_is_refused_for_the_checks():
    with pytest.raises(UsageError, match="holds 1 positions, too few for the generation checks"):
        causal_lm.check_lengths(1)


def test_a_decoder_of_12_positions_exports_with_shorter_checks(tmp_path):
    """Refused before the checks were fit to the positions (12 left no room
    after the 12-token prompt); now checked as docs/generation.md says, and it
    generates up to its last position."""
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=50,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=12,
    )
    model = zoo_models.redraw(keras_hub.models.GPT2CausalLM(backbone, preprocessor=None))
    path = tmp_path / "short.onnx"

    report = export_model(model, path, task="causal-lm")

    assert report["passed"]
    assert [check["shape"] for check in report["checks"] if "padded" not in check["shape"]] == [
        "prompt 4x6",
        "decode steps 1-6 (4x7 to 4x12)",
        "greedy 1x(6)+6",
        "greedy 4x(5,6,2,6)+6",
    ]
    assert generate(path, [[1, 2, 3]], 10).shape == (1, 13)  # feeds 12 positions
    with pytest.raises(ValueError, match="runs at most 12 positions"):
        generate(path, [[1, 2, 3]], 11)


def test_a_failed_check_exits_1_and_places_nothing(tmp_path):
    """Tolerances of zero cannot hold for float logits: the export fails,
    the output path stays empty and the files are kept under .failed names."""
    output = tmp_path / "gpt2.onnx"
    with pytest.raises(ValidationFailed) as caught:
        export_model(
            keras_hub_lm("gpt2"), output, ExportOptions(atol=0.0, rtol=0.0), task="causal-lm"
        )
    assert caught.value.exit_code == 1
    assert not output.exists()
    assert (tmp_path / "gpt2.failed.onnx").exists()
    assert not caught.value.report["passed"]


def test_a_model_without_the_protocol_is_refused_with_the_fix(tmp_path):
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    encoder = keras.Model(ids, keras.layers.Embedding(10, 4)(ids))
    with pytest.raises(UsageError, match="call_with_cache.*keras_layers.demo.TiedDecoder"):
        export_model(encoder, tmp_path / "x.onnx", task="causal-lm")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "options, message",
    [
        ({"task": "seq2seq"}, "choose one of"),
        ({"task": "causal-lm", "shapes": [(1, 3)]}, "leave the shapes out"),
        ({"task": "causal-lm", "quantize": "int8"}, "give -o FOLDER/"),
        ({"task": "forward", "quantize": "int4"}, "4-bit weights are for decoders"),
    ],
)
def test_options_that_do_not_fit_the_task_are_refused_before_any_work(tmp_path, options, message):
    options = dict(options)
    task = options.pop("task")
    with pytest.raises(UsageError, match=message):
        export_model(
            tmp_path / "missing.keras", tmp_path / "x.onnx", ExportOptions(**options), task=task
        )


def test_the_command_needs_a_model_for_causal_lm(tmp_path):
    result = subprocess.run(
        [sys.executable, "export/to_onnx.py", "--task", "causal-lm", "-o", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "needs MODEL" in result.stderr


def test_dynamic_update_slice_converts_as_tensorflow_computes_it():
    """keras-hub writes the cache with `ops.slice_update`, TensorFlow's
    `XlaDynamicUpdateSlice`; the handler must clamp starts as XLA does."""
    import tensorflow as tf

    from keras_layers.export import converting
    from keras_layers.export.tracing import TracedModel

    specs = [
        tf.TensorSpec((None, None, 3), tf.float32, name="operand"),
        tf.TensorSpec((None, None, None), tf.float32, name="update"),
        tf.TensorSpec((3,), tf.int32, name="starts"),
    ]

    def serve(operand, update, starts):
        return {"out": keras.ops.slice_update(operand, starts, update)}

    function = tf.function(serve, input_signature=specs, autograph=False)
    traced = TracedModel(function, specs, ["operand", "update", "starts"], ["out"], [])
    session = ort.InferenceSession(converting.convert(traced).proto.SerializeToString())
    rng = np.random.default_rng(0)
    for starts in ([0, 0, 0], [1, 2, 0], [0, 9, 0], [5, -3, 1], [0, 4, 2]):
        operand = rng.standard_normal((2, 6, 3)).astype("float32")
        update = rng.standard_normal((1, 2, 2)).astype("float32")
        feeds = {"operand": operand, "update": update, "starts": np.array(starts, "int32")}
        expected = serve(**{k: tf.constant(v) for k, v in feeds.items()})["out"].numpy()
        np.testing.assert_array_equal(session.run(None, feeds)[0], expected)


def test_generate_runs_without_tensorflow_or_keras(exported):
    _, path, _ = exported
    code = (
        "import sys; from keras_layers.export import generate; "
        f"out = generate({str(path)!r}, [[1, 2, 3]], 3); "
        "assert out.shape == (1, 6), out.shape; "
        "print(sorted(m for m in ('tensorflow', 'keras', 'tf2onnx') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_an_end_token_stops_a_row_and_pads_after_it(exported):
    _, path, _ = exported
    ids, mask = prompts()
    free = generate(path, ids, NEW_TOKENS, padding_mask=mask)
    row, length = 0, PROMPT_LENGTHS[0]
    end = int(free[row, length + 2])  # the row's third new token

    stopped = generate(path, ids, NEW_TOKENS, padding_mask=mask, end_token_id=end)

    first = length + list(free[row, length:]).index(end)
    np.testing.assert_array_equal(stopped[row, : first + 1], free[row, : first + 1])
    assert (stopped[row, first + 1 :] == 0).all()


def test_sampling_is_repeatable_by_seed_and_stays_in_the_vocabulary(exported):
    _, path, _ = exported
    ids, mask = prompts()
    for sampler in ("top_k", "top_p"):
        first = generate(path, ids, 8, padding_mask=mask, sampler=sampler, seed=5)
        again = generate(path, ids, 8, padding_mask=mask, sampler=sampler, seed=5)
        np.testing.assert_array_equal(first, again)
        assert first.min() >= 0 and first.max() < VOCAB


def test_generate_names_each_bad_argument(exported, tmp_path):
    _, path, _ = exported
    ids, mask = prompts()
    bad = [
        ({"token_ids": [1, 2, 3]}, "shape \\(batch, prompt length\\)"),
        ({"token_ids": [[0.5, 1.0]]}, "integer ids"),
        ({"max_new_tokens": 0}, "at least 1"),
        ({"max_new_tokens": 2.0}, "must be an int"),
        ({"padding_mask": mask[:, :2]}, "one mask value per token"),
        ({"padding_mask": mask[:, ::-1]}, "right padding"),
        ({"sampler": "beam"}, "greedy, top_k, top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"sampler": "top_k", "top_k": 0}, "top_k"),
        ({"temperature": 0}, "temperature"),
    ]
    for change, message in bad:
        arguments = {"token_ids": ids, "max_new_tokens": 4, "padding_mask": mask} | change
        with pytest.raises(ValueError, match=message):
            generate(path, **arguments)
    with pytest.raises(FileNotFoundError, match="no ONNX file"):
        generate(tmp_path / "missing.onnx", ids, 4)


def test_a_forward_file_is_not_taken_for_a_decoder(tmp_path):
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, keras.layers.Embedding(10, 4)(ids))
    path = tmp_path / "forward.onnx"
    export_model(model, path, ExportOptions(shapes=[(1, 3)]))
    with pytest.raises(ValueError, match="--task causal-lm"):
        generate(path, [[1, 2]], 2)


def test_keras_hub_models_outside_the_protocol_are_refused_not_crashed(tmp_path):
    """Gemma 3's cache is a list per layer, built with image inputs: a usage
    error naming what it builds, never an internal error."""
    model = zoo_models.build("Gemma3CausalLM")
    with pytest.raises(ExportError) as caught:
        export_model(model, tmp_path / "g3.onnx", task="causal-lm")
    assert caught.value.exit_code == 2
    assert "CausalLM protocol" in str(caught.value)


# keras-hub causal LMs that --task causal-lm refuses (exit 2), and why: their
# caches are built from image inputs too, hold recurrent state, or keras-hub's
# cached call fails in Keras itself.
REFUSED = {
    "Gemma3CausalLM": "_build_cache takes image inputs",
    "Gemma3nCausalLM": "_build_cache takes audio and image inputs",
    "Gemma4CausalLM": "_build_cache takes image inputs",
    "Gemma4AssistantCausalLM": "a drafter Keras cannot call alone",
    "PaliGemmaCausalLM": "reads images",
    # keras-hub's own cached call fails when Keras runs it eagerly (keras-hub
    # 0.32): "Can't convert Python sequence with mixed types to Tensor" and
    # "you cannot mix tensors and non-tensors" in a nested call() argument.
    "Qwen3MoeCausalLM": "call_with_cache fails in eager Keras",
    "SmolLM3CausalLM": "call_with_cache fails in eager Keras",
    "Qwen3_5CausalLM": "recurrent state besides the key/value cache",
    "Qwen3_5MoeCausalLM": "recurrent state besides the key/value cache",
    "RWKV7CausalLM": "recurrent state, no key/value cache",
}
CAUSAL_LMS = [m.name for m in zoo_models.candidates() if m.name.endswith("CausalLM")]
# Exported without attention_mask and position_ids (lockstep only), and why.
LOCKSTEP_ONLY = {
    "BloomCausalLM": "ALiBi: positions not computed by keras-hub's position layers",
    "FalconCausalLM": "ALiBi: positions not computed by keras-hub's position layers",
    "GPTNeoXCausalLM": "rotary from the sequence itself, no cache index",
    "GptOssCausalLM": "sliding window in cache slots",
    "MistralCausalLM": "sliding window in cache slots",
    "MixtralCausalLM": "sliding window in cache slots",
    "Qwen3CausalLM": "sliding window in cache slots",
}


@pytest.mark.zoo
@pytest.mark.parametrize("name", CAUSAL_LMS)
def test_every_keras_hub_causal_lm_generates_as_keras_or_is_refused(name, tmp_path):
    """The whole zoo's causal LMs, each exported as the onnxruntime-genai
    folder: the export's own checks (32 decode steps, greedy tokens against
    Keras recomputing, padded batches where the decoder takes a mask), genai
    running the folder on prompts of ids alone and batched, and keras-hub's
    compiled `generate` as a second oracle."""
    try:
        model = zoo_models.build(name)
    except zoo_models.NotATextModel as reason:
        assert name in REFUSED, reason
        return
    output = tmp_path / f"{name}.onnx"
    if name in REFUSED:
        with pytest.raises(ExportError) as caught:
            export_model(model, output, task="causal-lm")
        assert caught.value.exit_code == 2, caught.value
        return
    # The zoo's models have no tokenizer: the end id is any (0, as the folders
    # had before one was asked for), and their 32 positions the context.
    settings = ExportOptions(end_token_id=0, context_length=32)
    report = export_model(model, f"{tmp_path / name}/", settings, task="causal-lm")
    assert report["passed"]
    names = {entry["name"] for entry in report["inputs"]}
    padded = name not in LOCKSTEP_ONLY
    assert ("attention_mask" in names) == padded, LOCKSTEP_ONLY.get(name)
    genai = report["folder"]["genai"]
    assert len(genai) == 3 and all(row["tokens_equal"] for row in genai)
    batched = report["folder"]["genai_batched"]
    assert len(batched) == (3 if padded else 0) and all(row["batched_equal"] for row in batched)
    output = tmp_path / name / "model.onnx"
    ids, mask = prompts((5, 2, 7), seed=4)
    ids = ids % zoo_models.VOCAB
    ids[~mask] = 0
    ours = generate(output, ids, 6, padding_mask=mask)
    theirs = keras_hub_greedy(model, ids, mask, 6)
    for row, length in enumerate(mask.sum(axis=1)):
        np.testing.assert_array_equal(ours[row, : length + 6], theirs[row, : length + 6])
