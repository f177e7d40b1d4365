"""One file per part (`ExportOptions(parts=True)`, `--parts`): composites split
as deployments run them, each part proved, and the parts proved to compose
back to the whole model.

Each part is checked against Keras by the export itself; these tests add
what that cannot show: that the parts, chained in ONNX Runtime, compute what
the whole keras-hub model computes (CLIP's logits from its two towers,
NumPy's formula from the paper; SAM's masks from its encoder then its
prompt decoder; SD3's latents from its VAE encoder), that prompts are drawn
as a user gives them (every label, ordered boxes), and that the check fails
a file whose labels mean something else, which random floats never showed.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo_vision
from onnx import numpy_helper

from keras_layers.export import (
    ExportOptions,
    UsageError,
    ValidationFailed,
    cli,
    export_model,
    parts,
    prompts,
    validate,
)

pytestmark = [
    pytest.mark.tensorflow_only,
    pytest.mark.filterwarnings("ignore::UserWarning:keras.*"),
]


def _run(path, feeds: dict) -> dict:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    got = session.run(None, {k: v for k, v in feeds.items() if k in wanted})
    return dict(zip(names, got, strict=True))


TOWERS = ["report.json", "text_embedder.onnx", "vision_embedder.onnx"]


def _files(folder) -> list:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_two_towers_compose_to_clips_logits(tmp_path):
    import keras

    model = zoo_vision.build("CLIPBackbone")
    report = export_model(model, tmp_path / "clip/", ExportOptions(parts=True))
    assert report["passed"]
    assert _files(tmp_path / "clip") == TOWERS
    assert json.loads((tmp_path / "clip" / "report.json").read_text())["passed"]
    rng = np.random.default_rng(0)
    images = rng.standard_normal((3, 16, 16, 3)).astype("float32")
    # Each text ends in its highest id, where CLIP pools (the end token).
    ids = rng.integers(1, 50, (2, 9)).astype("int32")
    ids[:, -1] = 63
    vision = _run(tmp_path / "clip" / "vision_embedder.onnx", {"images": images})
    text = _run(tmp_path / "clip" / "text_embedder.onnx", {"token_ids": ids})
    (v,), (t,) = vision.values(), text.values()
    v = v / np.linalg.norm(v, axis=-1, keepdims=True)
    t = t / np.linalg.norm(t, axis=-1, keepdims=True)
    scale = np.exp(keras.ops.convert_to_numpy(model.clip_head.logit_scale))
    whole = model({"images": images, "token_ids": ids})
    np.testing.assert_allclose(
        scale * t @ v.T, keras.ops.convert_to_numpy(whole["text_logits"]), rtol=1e-4, atol=1e-4
    )


@pytest.fixture(scope="module")
def sam(tmp_path_factory):
    model = zoo_vision.build("SAMImageSegmenter")
    folder = tmp_path_factory.mktemp("sam") / "sam"
    report = export_model(model, f"{folder}/", ExportOptions(parts=True))
    return model, folder, report


def test_sams_encoder_then_prompt_decoder_give_the_segmenters_masks(sam):
    import keras

    model, folder, report = sam
    assert report["passed"]
    assert _files(folder) == ["image_encoder.onnx", "prompt_decoder.onnx", "report.json"]
    rng = np.random.default_rng(1)
    feeds = {
        "images": rng.standard_normal((2, 32, 32, 3)).astype("float32"),
        "points": rng.uniform(0, 32, (2, 3, 2)).astype("float32"),
        "labels": np.array([[1, 0, -1], [0, 1, 1]], "float32"),
        "boxes": np.sort(rng.uniform(0, 32, (2, 1, 2, 2)), axis=2).astype("float32"),
    }
    (embeddings,) = _run(folder / "image_encoder.onnx", feeds).values()
    decoded = _run(folder / "prompt_decoder.onnx", {**feeds, "image_embeddings": embeddings})
    # The whole segmenter, given no mask prompt (a count of 0).
    whole = model({**feeds, "masks": np.zeros((2, 0, 32, 32, 1), "float32")})
    for name, value in decoded.items():
        np.testing.assert_allclose(
            value, keras.ops.convert_to_numpy(whole[name]), rtol=1e-4, atol=1e-4
        )


def test_the_prompt_grid_feeds_every_label_and_ordered_boxes(sam):
    _, _, report = sam
    roles = {i["name"]: i["role"] for i in report["parts"]["prompt_decoder"]["inputs"]}
    assert roles == {
        "image_embeddings": "features",
        "points": prompts.POINTS,
        "labels": prompts.LABELS,
        "boxes": prompts.BOXES,
    }
    info = type("Info", (), {"role": prompts.LABELS, "dtype": "float32", "shape": (None, None)})
    labels = prompts.draw(info, 4, 3, np.random.default_rng(0))
    assert all(sorted(row) == [-1.0, 0.0, 1.0] for row in labels)
    info.role, info.shape, info.value_range = prompts.BOXES, (None, None, 2, 2), (0, 32)
    boxes = prompts.draw(info, 4, 5, np.random.default_rng(0))
    assert boxes.shape == (4, 5, 2, 2) and np.all(boxes[:, :, 0] <= boxes[:, :, 1])
    assert boxes.min() >= 0 and boxes.max() <= 32


def _labels_meaning_changed(path, out) -> int:
    """The prompt decoder with `labels == 0` and `labels == -1` read as
    `labels == 2`: background points and padding taken for foreground ones."""
    proto = onnx.load(str(path))
    constants = {t.name: t for t in proto.graph.initializer}
    changed = 0
    for node in proto.graph.node:
        if node.op_type != "Equal":
            continue
        for name in node.input:
            if name in constants:
                value = numpy_helper.to_array(constants[name])
                if value.size == 1 and float(value.reshape(())) in (0.0, -1.0):
                    constants[name].CopyFrom(numpy_helper.from_array(np.full_like(value, 2), name))
                    changed += 1
    onnx.save(proto, str(out))
    return changed


def test_a_file_whose_labels_mean_otherwise_fails_and_random_floats_missed_it(sam, tmp_path):
    model, folder, _ = sam
    decoder = parts.find_parts(model)[1]
    assert decoder.name == "prompt_decoder"
    mutant = tmp_path / "mutant.onnx"
    assert _labels_meaning_changed(folder / "prompt_decoder.onnx", mutant) >= 1
    with pytest.raises(ValidationFailed, match="output 'masks'"):
        validate(decoder.model, mutant)
    # Labels drawn as plain features (N(0, 1): never exactly 0 or -1) pass it.
    blind = ExportOptions(input_roles={"labels": "features"})
    assert validate(decoder.model, mutant, blind)["passed"]


# 25 s: CI runs it with the slow tier; the default suite keeps SAM and the two towers.
@pytest.mark.slow
def test_stable_diffusion_3_splits_as_its_steps_and_the_vae_encoder_gives_its_latents(tmp_path):
    import keras

    model = zoo_vision.build("StableDiffusion3Backbone")
    report = export_model(model, tmp_path / "sd3/", ExportOptions(parts=True))
    assert list(report["parts"]) == ["text_encoder", "diffuser", "vae_decoder", "vae_encoder"]
    assert all(part["passed"] for part in report["parts"].values())
    images = np.random.default_rng(2).standard_normal((2, 32, 32, 3)).astype("float32")
    (latents,) = _run(tmp_path / "sd3" / "vae_encoder.onnx", {"images": images}).values()
    whole = model.encode_image_step(images)
    np.testing.assert_allclose(latents, keras.ops.convert_to_numpy(whole), rtol=1e-4, atol=1e-4)


def test_parts_refuses_what_it_cannot_split_or_write(tmp_path):
    import keras

    inputs = keras.Input((4,), name="x")
    plain = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(UsageError, match="no composite known here"):
        export_model(plain, tmp_path / "plain/", ExportOptions(parts=True))
    assert not (tmp_path / "plain").exists()
    clip = zoo_vision.build("CLIPBackbone")
    with pytest.raises(UsageError, match="into a folder"):
        export_model(clip, tmp_path / "clip.onnx", ExportOptions(parts=True))
    with pytest.raises(UsageError, match="forward export"):
        export_model(clip, f"{tmp_path}/c/", ExportOptions(parts=True), task="causal-lm")
    with pytest.raises(UsageError, match="FOLDER/report.json"):
        export_model(clip, f"{tmp_path}/c/", ExportOptions(parts=True, report_path=tmp_path / "r"))
    with pytest.raises(UsageError, match="preprocessor"):
        ExportOptions(parts=True, preprocessor=True)
    assert not (tmp_path / "c").exists() and not (tmp_path / "clip.onnx").exists()


def test_a_failing_part_places_nothing_and_is_named(tmp_path, monkeypatch):
    from keras_layers.export import pipeline

    clip = zoo_vision.build("CLIPBackbone")
    folder = tmp_path / "clip"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    exported = []
    real = pipeline.export_model

    def second_fails(model, output, options, **kwargs):  # after the first is staged
        if exported:
            message = "validation failed: made to fail. The file was kept"
            raise ValidationFailed(message, {}, "made to fail")
        exported.append(real(model, output, options, **kwargs))
        return exported[-1]

    monkeypatch.setattr(pipeline, "export_model", second_fails)
    with pytest.raises(ValidationFailed) as failed:
        export_model(clip, folder, ExportOptions(parts=True))
    assert str(failed.value).startswith("part 'text_embedder' (token ids")
    assert "made to fail. Nothing was placed" in str(failed.value)
    assert "kept" not in str(failed.value)  # the staged files are gone with the staging
    assert exported and _files(folder) == ["notes.txt"]


def test_the_command_line_takes_parts_into_a_folder_only(tmp_path, capsys):
    clip = zoo_vision.build("CLIPBackbone")
    path = tmp_path / "clip.keras"
    clip.save(path)
    assert cli.main([str(path), "--parts", "-o", str(tmp_path / "clip.onnx")]) == 2
    assert "give -o FOLDER/" in capsys.readouterr().err
    (tmp_path / "x.onnx").write_bytes(b"")  # refused for the flag before the file is read
    checked = cli.main([str(path), str(tmp_path / "x.onnx"), "--check-only", "--parts"])
    assert checked == 2 and "--parts: --check-only checks" in capsys.readouterr().err
    assert cli.main([str(path), "--tokenizer-only", "--parts"]) == 2
    assert "--parts: not taken with --tokenizer-only" in capsys.readouterr().err
    assert cli.main([str(path), "--parts", "-o", f"{tmp_path}/clip/"]) == 0
    printed = capsys.readouterr().out
    assert "vision_embedder" in printed and "text_embedder" in printed
    assert _files(tmp_path / "clip") == TOWERS


def test_sams_four_mask_tokens_are_no_position_table_bounding_the_prompts(sam):
    """The mask decoder embeds `arange(4)` (its mask tokens) whatever the
    prompts' count: taken for a position table, it bounded the grid to 4
    points; only an `arange` as long as the probe's tokens is one."""
    from keras_layers.export import loading, validating

    model, _, report = sam
    loaded = loading.load(parts.find_parts(model)[1].model)
    assert loaded.max_length is None
    checks = report["parts"]["prompt_decoder"]["checks"]
    counts = {c["shape"].split("x")[1] for c in checks if "x" in c["shape"]}
    assert {"64", "256"} <= counts
    grid = validating.default_shapes(loaded)
    assert max(point[1] for point in grid if point not in validating.NAMED_POINTS) == 256
    assert grid[-1] == prompts.UNPROMPTED  # its boxes are optional


def test_a_folder_re_exported_from_another_composite_holds_only_the_new_parts(sam, tmp_path):
    model, _, _ = sam
    folder = tmp_path / "parts"
    export_model(model, f"{folder}/", ExportOptions(parts=True))
    (folder / "notes.txt").write_text("mine")
    export_model(zoo_vision.build("CLIPBackbone"), f"{folder}/", ExportOptions(parts=True))
    assert _files(folder) == sorted(["notes.txt", *TOWERS])
    report = json.loads((folder / "report.json").read_text())
    assert list(report["parts"]) == ["vision_embedder", "text_embedder"]
