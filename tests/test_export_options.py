"""`ExportOptions` and the task registry: the shape of `export_model`'s API."""

import ast
import inspect
from pathlib import Path

import keras
import pytest
from models import tied_encoder

from keras_layers import ScaledEmbedding
from keras_layers.export import ExportOptions, UsageError, export_model, pipeline, tasks
from keras_layers.export.cli import FLAGS, parser
from keras_layers.export.errors import command_line_wording
from keras_layers.export.inputs import InputRole
from keras_layers.export.tasks.forward import Forward

pytestmark = pytest.mark.tensorflow_only  # the opset check asks tf2onnx; the pipeline runs on TF


@pytest.mark.parametrize(
    "fields, api, command_line",
    [
        ({"atol": -1.0}, "atol=-1.0: must be >= 0", "--atol -1.0: must be >= 0"),
        ({"rtol": float("nan")}, "rtol=nan: must be a finite number >= 0", "--rtol nan"),
        ({"atol": True}, "atol=True: must be a finite number >= 0", "--atol True"),
        ({"opset": 99}, "opset=99: unsupported; choose 13-", "--opset 99: unsupported"),
        (
            {"quantize": "int2"},
            "quantize='int2': unsupported; choose one of ('int8', 'int4')",
            "--quantize int2: unsupported",
        ),
        (
            {"external_data": "sometimes"},
            "external_data='sometimes': choose one of ('auto', 'always', 'never')",
            "--external-data sometimes: choose one of",
        ),
        ({"shapes": []}, "shapes=[]: give a non-empty list", "--shapes []: give a non-empty"),
        (
            {"shapes": [(0, 3)]},
            "shapes=[(0, 3)]: (0, 3) is not a (batch, sequence) pair of positive integers",
            "--shapes [(0, 3)]: (0, 3) is not",
        ),
        (
            {"shapes": [(100_000, 100_000)]},
            "is 10,000,000,000 tokens; at most 1,048,576 per grid point",
            "--shapes [(100000, 100000)]",
        ),
        (
            {"input_roles": {"flags": "bogus"}},
            "input_roles={'flags': 'bogus'}: 'flags=bogus' is not NAME=ROLE[@AXIS]",
            "--input {'flags': 'bogus'}: 'flags=bogus' is not NAME=ROLE[@AXIS]",
        ),
    ],
)
def test_bad_options_are_refused_when_made_naming_the_field_or_the_flag(fields, api, command_line):
    with pytest.raises(UsageError) as raised:
        ExportOptions(**fields)
    assert api in str(raised.value)
    with command_line_wording(FLAGS, {}), pytest.raises(UsageError) as raised:
        ExportOptions(**fields)
    assert command_line in str(raised.value)


def test_options_are_normalised_once_and_frozen():
    options = ExportOptions(
        report_path="r.json",
        atol=0,
        imports="my_layers",
        input_roles={"flags": "ids@tokens", "x": InputRole("features")},
    )
    assert options.report_path == Path("r.json")
    assert options.atol == 0.0 and isinstance(options.atol, float)
    assert options.imports == ("my_layers",)
    assert options.input_roles == {
        "flags": InputRole("ids", "tokens"),
        "x": InputRole("features", None),
    }
    with pytest.raises(AttributeError):
        options.atol = 1.0  # frozen: checked once, never changed after


def test_an_input_role_is_checked_when_made():
    with pytest.raises(ValueError, match="'bogus@t' is not ROLE"):
        InputRole("bogus", "t")
    with pytest.raises(ValueError, match="is not ROLE"):
        InputRole("ids", "two words")
    assert str(InputRole("ids", "tokens")) == "ids@tokens" and str(InputRole("ids")) == "ids"


def test_the_command_parses_input_roles_once_into_the_options(tmp_path):
    """`--input` becomes an `InputRole` when the flags are parsed: the options
    hold it as it is, nothing joins it back into text."""
    from keras_layers.export.cli import _options

    args = parser("x", tmp_path).parse_args(
        ["m.keras", "--input", "flags=ids@words", "--input", "mask=padding_mask"]
    )
    assert args.input_roles == [
        ("flags", InputRole("ids", "words")),
        ("mask", InputRole("padding_mask")),
    ]
    options = _options(args)
    assert options.input_roles == {"flags": args.input_roles[0][1], "mask": args.input_roles[1][1]}
    assert options.input_roles["flags"] is args.input_roles[0][1]


def test_export_model_takes_at_most_eight_parameters():
    parameters = inspect.signature(export_model).parameters
    assert len(parameters) <= 8, list(parameters)
    assert list(parameters)[:3] == ["model", "output", "options"]


def test_every_setting_of_the_command_line_is_an_option_field():
    """Each option flag fills the `ExportOptions` field of its name (`cli._options`)."""
    from dataclasses import fields

    names = {field.name for field in fields(ExportOptions)}
    flags = set(FLAGS) - {"model", "output", "onnx_path", "task"}  # arguments, not options
    assert flags <= names, flags - names


def test_something_else_than_options_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"options=\[\(1, 3\)\]: expected an ExportOptions"):
        export_model(tied_encoder(layers=1), tmp_path / "x.onnx", [(1, 3)])
    assert list(tmp_path.iterdir()) == []


def test_the_pipeline_never_asks_which_task_it_runs():
    """No comparison with a task's name in `pipeline`: what differs between
    tasks is the task's (`keras_layers.export.tasks`)."""
    tree = ast.parse(inspect.getsource(pipeline))
    compared = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(
            isinstance(side, ast.Constant) and side.value in tasks.TASKS
            for side in (node.left, *node.comparators)
        )
    ]
    assert compared == []


class Recording(Forward):
    """A task of its own: the forward pass, recording what the pipeline asks
    of it, and refusing `quantize`."""

    name = "recording"
    calls: list = []

    def check(self, options):
        self.calls.append("check")
        if options.quantize:
            raise UsageError("quantize: the recording task refuses it")

    def describe(self, loaded):
        self.calls.append("describe")
        return super().describe(loaded)

    def trace(self, loaded):
        self.calls.append("trace")
        return super().trace(loaded)

    def grid(self, loaded, shapes):
        self.calls.append("grid")
        return [(1, 2)]  # the task's own grid, whatever the caller asked

    def references(self, loaded, grid, ahead):
        self.calls.append("references")
        return super().references(loaded, grid, ahead)

    def validate(self, loaded, onnx_path, checks):
        self.calls.append("validate")
        return super().validate(loaded, onnx_path, checks)


@pytest.fixture
def recording_task(monkeypatch):
    Recording.calls = []
    monkeypatch.setitem(tasks.TASKS, "recording", Recording)
    return Recording


def test_a_task_plugs_in_through_the_registry(tmp_path, recording_task):
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, ScaledEmbedding(20, 4)(ids))
    report = export_model(model, tmp_path / "r.onnx", task="recording")
    assert report["passed"]
    assert [check["shape"] for check in report["checks"]] == ["1x2"]
    assert recording_task.calls == [
        "check",
        "describe",
        "trace",
        "grid",
        "references",
        "validate",
    ]


def test_a_task_refuses_its_options_before_any_work(tmp_path, recording_task):
    with pytest.raises(UsageError, match="the recording task refuses it"):
        export_model(
            tmp_path / "missing.keras",
            tmp_path / "x.onnx",
            ExportOptions(quantize="int8"),
            task="recording",
        )
    assert recording_task.calls == ["check"]
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_task_names_the_registered_ones(tmp_path, recording_task):
    with pytest.raises(UsageError) as raised:
        export_model(tmp_path / "missing.keras", tmp_path / "x.onnx", task="seq2seq")
    named = "('forward', 'causal-lm', 'recording', 'seq2seq-lm')"
    assert f"task='seq2seq': choose one of {named}" in str(raised.value)
    assert parser("x", tmp_path).parse_args(["--task", "causal-lm"]).task == "causal-lm"


def test_preprocessor_flags_are_booleans_and_pairs_need_the_preprocessor():
    with pytest.raises(UsageError, match="preprocessor='yes': give True or False"):
        ExportOptions(preprocessor="yes")
    with pytest.raises(UsageError, match="text_pairs=True: only with preprocessor=True"):
        ExportOptions(text_pairs=True)
    assert ExportOptions(preprocessor=True, text_pairs=True).text_pairs


def test_preprocessor_true_goes_through_export_model_only(tmp_path):
    from keras_layers.export import export_model, pipeline

    options = ExportOptions(preprocessor=True)
    with pytest.raises(UsageError, match="preprocessor=True: this stage exports token ids in"):
        pipeline.export_model("never read.keras", tmp_path / "x.onnx", options)
    with pytest.raises(UsageError, match="task='causal-lm': preprocessor=True exports"):
        export_model("never read.keras", tmp_path / "x.onnx", options, task="causal-lm")
    assert list(tmp_path.iterdir()) == []
