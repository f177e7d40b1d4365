"""The zoo tier, other modalities: every keras-hub image, audio, video and
multimodal model, exported with the default flags.

The models are enumerated from `keras_hub.models` by tests/zoo_vision.py (its
docstring states the rule: what the text zoo skips, and every task on it) and
built tiny, offline, with redrawn weights; composites (CLIP, SAM, RetinaNet,
DeepLabV3, ...) from tiny parts. Each test exports one with no `shapes=`, as
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

from keras_layers.export import ExportError, export_model

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
KNOWN = zoo_vision.KNOWN
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
    assert set(FAST) | set(KNOWN) | set(zoo_vision.NOT_BUILT) <= set(NAMES)
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


@pytest.mark.parametrize("name", _params([name for name in BUILT if name not in KNOWN]))
def test_exports_with_default_flags_and_matches_keras_on_an_independent_feed(name, tmp_path):
    model = zoo_vision.build(name)
    output = tmp_path / f"{name}.onnx"
    _assert_parts_as_listed(model, name)
    report = export_model(model, output)
    assert report["passed"]
    assert not any(entry["name"].startswith("keras_tensor") for entry in report["inputs"])
    differences = zoo_vision.parity(model, output, zoo_vision.media_feed(model, name))
    assert max(differences.values()) <= zoo_vision.FEED_ATOL, differences


@pytest.mark.parametrize("name", _params(sorted(KNOWN)))
def test_a_known_failure_fails_with_its_stated_error(name, tmp_path):
    """Not an internal error: the user is told what is wrong, with the error
    and exit status `KNOWN` states. Once such an export passes, this fails:
    move the model out of `KNOWN`."""
    model = zoo_vision.build(name)
    _assert_parts_as_listed(model, name)
    with pytest.raises(ExportError) as caught:
        export_model(model, tmp_path / f"{name}.onnx")
    error = caught.value
    assert f"{type(error).__name__} (exit {error.exit_code})" in KNOWN[name], error


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
