"""The zoo tier, other modalities: every keras-hub image, audio, video and
multimodal model, exported with the default flags.

The models are enumerated from `keras_hub.models` by tests/zoo_vision.py (its
docstring states the rule: what the text zoo skips, and every task on it) and
built tiny, offline, with redrawn weights; composites (CLIP, SAM, RetinaNet,
DeepLabV3, ...) from tiny parts. Each test exports one with the default flags
(or the one flag `FLAGS` names, which the default export's error names), as
a user would, asserts the report passed, then runs the file in ONNX Runtime
on a feed built here from the inputs' shapes alone (`zoo_vision.media_feed`:
three rows, free image sides 64 x 96, audio of 1,024 samples), compared with
Keras.

Every model but `FAST` carries the `zoo` marker. benchmarks/zoo_vision.py
runs the same models and renders the table of docs/models.md, which the last
test here checks against its JSON.
"""

import json

import pytest
import zoo_models
import zoo_vision

from keras_layers.export import ExportOptions, UsageError, export_model

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.filterwarnings("ignore::UserWarning:keras.*"),
]

# The default suite's share: a CNN classifier, a ViT classifier, a two-tower
# composite, a segmenter on a pyramid and a speech model.
FAST = (
    "ResNetImageClassifier",
    "ViTImageClassifier",
    "CLIPBackbone",
    "SegFormerImageSegmenter",
    "MoonshineBackbone",
)
ENTRIES = zoo_vision.enumerate_vision()
NAMES = [entry.name for entry in ENTRIES]
BUILT = [name for name in NAMES if name not in zoo_vision.NOT_BUILT]


def _params(names):
    return [
        pytest.param(name, id=name, marks=() if name in FAST else pytest.mark.zoo) for name in names
    ]


def test_the_vision_zoo_is_every_class_the_text_zoo_skips():
    """Each backbone the text zoo's rule skips is here, with each task on it;
    the lists here name classes keras-hub has, so none goes stale silently."""
    skipped = {entry.name for entry in zoo_models.enumerate_zoo() if entry.skip_reason}
    assert skipped <= set(NAMES), skipped - set(NAMES)
    backbones = {entry.name for entry in ENTRIES if entry.kind == "backbone"}
    assert set(zoo_vision.READS_MEDIA) <= backbones
    assert set(FAST) | set(zoo_vision.FLAGS) | set(zoo_vision.NOT_BUILT) <= set(NAMES)
    tasks = [entry for entry in ENTRIES if entry.kind != "backbone"]
    assert {entry.backbone for entry in tasks} <= backbones
    assert len(backbones) > 35 and len(tasks) > 25


@pytest.mark.zoo
@pytest.mark.parametrize("name", zoo_vision.READS_MEDIA)
def test_reads_media_is_what_the_text_rule_skips_once_built(name):
    """`READS_MEDIA` keeps step 2 of the text rule's outcome: built, each reads a float."""
    with pytest.raises(zoo_models.NotATextModel, match="reads non-integer inputs"):
        zoo_models.build(name)


@pytest.mark.parametrize("name", sorted(zoo_vision.NOT_BUILT))
def test_a_class_with_no_tiny_model_says_why(name):
    with pytest.raises(zoo_vision.NotBuilt, match=zoo_vision.NOT_BUILT[name][:20]):
        zoo_vision.build(name)


@pytest.mark.parametrize("name", _params(BUILT))
def test_exports_with_default_flags_and_matches_keras_on_an_independent_feed(name, tmp_path):
    """With the default flags, or the one `FLAGS` gives (the one the default
    export's error names: `test_the_flag_a_model_needs_is_named_by_its_error`)."""
    model = zoo_vision.build(name)
    output = tmp_path / f"{name}.onnx"
    _assert_parts_as_listed(model, name)
    flags, _ = zoo_vision.FLAGS.get(name, ({}, ""))
    report = export_model(model, output, ExportOptions(**flags))
    assert report["passed"]
    assert not any(entry["name"].startswith("keras_tensor") for entry in report["inputs"])
    # Token ids are drawn over the vocabulary, never as 0/1 features (SAM 3's
    # were, while the role probe failed on its boxes).
    assert not any(
        entry["name"].endswith("token_ids") and entry["role"] == "features"
        for entry in report["inputs"]
    ), report["inputs"]
    differences = zoo_vision.parity(model, output, zoo_vision.media_feed(model, name))
    assert max(differences.values()) <= zoo_vision.FEED_ATOL, differences


@pytest.mark.zoo
def test_the_flag_a_model_needs_is_named_by_its_error(tmp_path):
    """SAM3 runs in Keras on one image at a time (`FLAGS`): the default
    export stops at the grid's batch 2 with exit 2, naming the model's
    constraint and the fix, and leaves nothing at the output."""
    name = "SAM3PromptableConceptBackbone"
    assert all(point[0] == 1 for point in zoo_vision.FLAGS[name][0]["shapes"][:-1])
    output = tmp_path / f"{name}.onnx"
    with pytest.raises(UsageError) as caught:
        export_model(zoo_vision.build(name), output)
    message = str(caught.value)
    assert "fails in Keras itself" in message and "It ran on one row" in message, message
    assert "give a grid of batch 1" in message and "shapes" in message, message
    assert not output.exists()


def _assert_parts_as_listed(model, name):
    """`PARTS` lists exactly the classes `--parts` splits: each built model is
    asked in its export test (the two tests below see every built class)."""
    from keras_layers.export.parts import find_parts

    assert bool(find_parts(model)) == (name in zoo_vision.PARTS), name


def test_every_class_listed_with_parts_is_built_and_exported():
    assert set(zoo_vision.PARTS) <= set(BUILT)


@pytest.mark.zoo
@pytest.mark.parametrize("name", zoo_vision.PARTS)
def test_a_composite_exports_one_proved_file_per_part(name, tmp_path):
    exported = zoo_vision.export_parts(zoo_vision.build(name), tmp_path / name, name)
    assert exported["report"]["passed"]
    for part, difference in exported["feed"].items():
        assert difference <= zoo_vision.FEED_ATOL, (part, difference)


def test_models_page_vision_table_is_rendered_from_its_json():
    from benchmarks import zoo_vision as bench

    on_page = bench.page_table()
    assert on_page is not None, f"no `<!-- table: {bench.TABLE} -->` on {bench.PAGE.name}"
    assert on_page == bench.render(json.loads(bench.RESULT.read_text())), (
        f"the vision zoo table of {bench.PAGE.name} differs from {bench.RESULT.name}; "
        "run `python benchmarks/zoo_vision.py --table`"
    )


def test_each_class_the_text_table_hands_on_has_its_row_in_the_vision_table():
    """docs/models.md lists no skipped class: what the text rule hands on is
    in the vision zoo's table, from its JSON."""
    from benchmarks import zoo
    from benchmarks import zoo_vision as bench

    text = json.loads(zoo.RESULT.read_text())["models"]
    handed = {row["name"] for row in text if row["status"] == zoo.VISION_ZOO}
    vision = {row["name"] for row in json.loads(bench.RESULT.read_text())["models"]}
    assert len(handed) > 40 and handed <= vision, handed - vision
