"""Make correct exports wrong the ways exports go wrong, and check that validation fails each.

    python benchmarks/mutation.py                  # every model: results/mutation.json
    python benchmarks/mutation.py --quick          # the quick set: results/mutation.quick.json
    python benchmarks/mutation.py --models A B     # some models (written as a --quick run is)
    python benchmarks/mutation.py --no-conformance # without tests/conformance/'s models

Each model of `MODELS` (the demo's, tiny keras-hub ones from
tests/zoo_models.py, and the conformance set of tests/conformance/) is
exported with the default settings, as a user would run it; every mutation
of tests/mutants.py is applied to the file, and each mutant is checked by
`keras_layers.export.validate` with the default settings (and the model's
input roles, where the export needed them). A row per model and mutation
records whether the mutation applied (or why not), whether validation failed
the mutant (killed) or passed it (survived), and the validator's worst check:
its message, largest absolute and relative difference, the lowest top-1
agreement, against the tolerances. A survivor is a bug validation would let
through.

`MODELS` is a registry (name -> `ModelEntry`): `register` adds a model, with
a builder that returns a fresh `keras.Model`. Reading the JSON must stay
light: this module imports nothing heavy at import time.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # mutants and zoo_models live with the tests that use them

import mutants  # noqa: E402

from benchmarks.results_io import run_header, save_json  # noqa: E402

NAME = "mutation"


@dataclass(frozen=True)
class ModelEntry:
    """A model to export and mutate.

    `build` returns a fresh `keras.Model`; `fusions=False` exports it with
    every fusion pass left out, so the mutations meet the decomposed forms
    (Softmax attention, LayerNorm as ReduceMean/Sqrt) that other exporters
    write; `input_roles` is the `ExportOptions.input_roles` the export and
    every validation get (otherwise both run with every default); `quick`
    puts it in the `--quick` set.
    """

    name: str
    build: Callable[[], object]
    description: str
    quick: bool = False
    fusions: bool = True
    input_roles: Mapping = field(default_factory=dict)

    def options(self):
        from keras_layers.export import ExportOptions

        return ExportOptions(input_roles=self.input_roles) if self.input_roles else None


MODELS: dict[str, ModelEntry] = {}


def register(name: str, build: Callable[[], object], description: str, **switches) -> ModelEntry:
    """Add a model to `MODELS` (a name already there is replaced); `switches`
    are `ModelEntry`'s `quick`, `fusions` and `input_roles`."""
    MODELS[name] = ModelEntry(name, build, description, **switches)
    return MODELS[name]


def register_conformance() -> None:
    """Add the conformance set (tests/conformance/: public example models,
    each module's `build` and `INPUT_ROLES`) as `conformance/<name>`.
    Called by `main`, not on import: the set imports Keras."""
    from tests import conformance

    for name, module in conformance.MODELS.items():
        register(
            f"conformance/{name}",
            module.build,
            f"conformance: {(module.__doc__ or name).strip().splitlines()[0]}",
            input_roles=getattr(module, "INPUT_ROLES", {}),
        )


# --- the models ------------------------------------------------------------------------------


def _demo_encoder():
    from keras_layers.demo import EncoderConfig, build_encoder

    return build_encoder(EncoderConfig(vocabulary=300, width=32, layers=2), seed=7)


def _demo_decoder():
    import keras

    from keras_layers.demo.decoder import TiedDecoder

    keras.utils.set_random_seed(7)
    return TiedDecoder(vocabulary=300, width=32, layers=2, heads=4, intermediate=64)


def _zoo(name: str, **arguments) -> Callable[[], object]:
    """A builder of the tiny keras-hub model `name` of tests/zoo_models.py,
    its backbone built with `arguments` on top of the zoo's tiny ones."""

    def build():
        import zoo_models

        if not arguments:
            return zoo_models.build(name)
        import keras

        entry = zoo_models.by_name(name)
        keras.backend.clear_session()
        keras.utils.set_random_seed(zoo_models.SEED)
        backbone_cls = entry.cls if entry.kind == "backbone" else entry.cls.backbone_cls
        backbone = backbone_cls(**zoo_models.tiny_arguments(backbone_cls, arguments))
        if entry.kind == "backbone":
            return zoo_models.redraw(backbone)
        task = entry.cls(backbone=backbone, preprocessor=None)
        return zoo_models.redraw(task)

    return build


def _masked_lstm():
    import keras

    keras.utils.set_random_seed(3)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    hidden = keras.layers.Embedding(50, 8, mask_zero=True, name="embedding")(ids)
    hidden = keras.layers.LSTM(8, return_sequences=True, name="lstm")(hidden)
    return keras.Model(ids, keras.layers.Dense(5, name="head")(hidden), name="masked_lstm")


register(
    "demo_encoder",
    _demo_encoder,
    "the demo's tied encoder (ScaledEmbedding, sinusoid, 2 keras-hub TransformerEncoders, "
    "padding mask from id 0)",
    quick=True,
)
register(
    "demo_encoder_unfused",
    _demo_encoder,
    "the same encoder exported without the fusion passes (Softmax attention, decomposed norms)",
    quick=True,
    fusions=False,
)
register(
    "demo_decoder",
    _demo_decoder,
    "the demo's tied decoder (2 pre-norm keras-hub TransformerDecoders, padding_mask input)",
)
register("GPT2Backbone", _zoo("GPT2Backbone"), "keras-hub GPT-2, tiny", quick=True)
register("BertBackbone", _zoo("BertBackbone"), "keras-hub BERT, tiny")
register("LlamaBackbone", _zoo("LlamaBackbone"), "keras-hub Llama, tiny (RMS norm, RoPE, GQA)")
register(
    "GemmaCausalLM_softcap",
    _zoo("GemmaCausalLM", attention_logit_soft_cap=50.0, final_logit_soft_cap=30.0),
    "keras-hub Gemma with Gemma 2's softcaps (attention 50, logits 30), tiny",
)
register("masked_lstm", _masked_lstm, "Embedding(mask_zero=True) -> LSTM -> Dense")


def _vision(name: str) -> Callable[[], object]:
    """A builder of the tiny keras-hub model `name` of tests/zoo_vision.py."""

    def build():
        import zoo_vision

        return zoo_vision.build(name)

    return build


def _sam_prompt_decoder():
    import zoo_vision

    from keras_layers.export.parts import find_parts

    return find_parts(zoo_vision.build("SAMImageSegmenter"))[1].model


for _name, _what in (
    ("ResNetImageClassifier", "a ResNet classifier (Conv, BatchNorm, pooling)"),
    ("ViTImageClassifier", "a ViT classifier (patches, attention)"),
    ("SegFormerImageSegmenter", "a SegFormer segmenter (a MiT pyramid, per-pixel classes)"),
    ("DeepLabV3ImageSegmenter", "a DeepLabV3 segmenter on a ResNet (atrous Conv, upsampling)"),
    ("RetinaNetObjectDetector", "a RetinaNet detector on a ResNet (raw boxes and classes)"),
    ("CLIPBackbone", "CLIP (an image tower and a text tower, their logits)"),
    ("MoonshineBackbone", "Moonshine's speech encoder (waveform in, strided Conv1D)"),
    ("WhisperBackbone", "Whisper (log-mel frames in, an encoder-decoder)"),
):
    register(f"vision/{_name}", _vision(_name), f"keras-hub, tiny: {_what}")
register(
    "vision/SAM_prompt_decoder",
    _sam_prompt_decoder,
    "keras-hub SAM's prompt decoder (`--parts`): image embeddings, points, labels, boxes",
)


# --- one model -----------------------------------------------------------------------------


def _export(entry: ModelEntry, model: Path, path: Path) -> dict:
    from keras_layers.export import export_model

    if entry.fusions:
        return export_model(model, path, entry.options())
    from unittest import mock

    from keras_layers.export import slimming

    fusions = [step.pass_ for step in slimming.PASSES if hasattr(step.pass_, "MAKES")]
    with mock.patch.object(slimming, "PASSES", slimming.without(*fusions)):
        return export_model(model, path, entry.options())


def _one_line(error: BaseException) -> str:
    from keras_layers.export.errors import one_line

    return one_line(f"{type(error).__name__}: {error}", limit=300)


# The worst check's entries kept in a row (whichever the validator reports).
WORST_KEYS = (
    "output",
    "shape",
    "max_abs_diff",
    "max_rel_diff",
    "max_scaled_diff",
    "space",
    "scale",
    "bound",
    "top1_agreement",
    "problem",
)


def _worst(report: dict, failure: str | None = None) -> dict:
    """The validator's worst check: `failure`, its own words for why it
    failed, or for a passed file the worst check's output, shape and difference."""
    worst = report.get("worst") or {}
    if failure is None:
        failure = report.get("validation_error") or (
            f"passed; worst: output {worst.get('output')!r} at shape {worst.get('shape')}, "
            f"max abs diff {worst.get('max_abs_diff', float('nan')):.3g}"
        )
    top1 = [check.get("top1_agreement") for check in report.get("checks", [])]
    top1 = [value for value in top1 if value is not None]
    return {
        "message": failure,
        **{key: worst[key] for key in WORST_KEYS if key in worst},
        "min_top1_agreement": min(top1) if top1 else None,
        "tolerances": report.get("tolerances"),
    }


def _failure(error, path: Path) -> str:
    """`ValidationFailed`'s reason, without the sentence on the file."""
    text = str(error).removeprefix("validation failed: ")
    return text.split(f". {path} was only read", 1)[0]


def check_mutant(entry: ModelEntry, model, path: Path) -> dict:
    """Validate one mutant as the export was validated: killed or survived."""
    from keras_layers.export import UsageError, ValidationFailed, validate

    start = time.perf_counter()
    try:
        report, failure, outcome = validate(model, path, entry.options()), None, "survived"
    except ValidationFailed as error:
        report, failure, outcome = error.report, _failure(error, path), "killed"
    except UsageError as error:  # ONNX Runtime refused the mutant: a bug of the mutation
        return {"outcome": "invalid mutant", "message": _one_line(error)}
    seconds = round(time.perf_counter() - start, 2)
    return {"outcome": outcome, **_worst(report, failure), "validate_seconds": seconds}


@contextmanager
def _references_once():
    """Keras' outputs over the grid computed once for all the mutants of one
    model: each mutant is validated against the same model on the same grid
    from the same seed, so the references are the same; only ONNX Runtime's
    side differs. The export's own validation (of the model reloaded from
    its file) computes its own."""
    from unittest import mock

    from keras_layers.export import validating

    original, computed = validating.keras_references, {}

    def once(loaded, shapes=None):
        key = repr(shapes)
        if key not in computed:
            computed[key] = list(original(loaded, shapes))
        yield from computed[key]

    with mock.patch.object(validating, "keras_references", once):
        yield


def run_model(entry: ModelEntry, folder: Path) -> dict:
    """Export `entry`, mutate the file every way, validate every mutant; never raises."""
    import onnx

    row = {"name": entry.name, "description": entry.description, "fusions": entry.fusions}
    try:
        model = entry.build()
        source = folder / f"{entry.name}.onnx"
        source.parent.mkdir(parents=True, exist_ok=True)
        # Exported from its .keras file, as a user exports it.
        saved = folder / f"{entry.name}.keras"
        model.save(saved)
        start = time.perf_counter()
        report = _export(entry, saved, source)
        row["export_seconds"] = round(time.perf_counter() - start, 2)
    except Exception as error:  # a model that does not export is a row, not a crash
        return {**row, "status": "export failed", "error": _one_line(error)}
    row["status"] = "exported"
    row["baseline"] = _worst(report)
    row["fused"] = {op: count for op, count in report["graph"]["fused"].items() if count}
    proto = onnx.load(str(source))
    row["mutants"] = {}
    with _references_once():
        for mutation in mutants.MUTATIONS:
            mutant = mutation.apply(proto)
            if not mutant.applied:
                reason = mutant.reason
                row["mutants"][mutation.name] = {"outcome": "not applicable", "reason": reason}
                continue
            path = mutants.save(mutant, folder / f"{entry.name}.{mutation.name}.onnx", source)
            result = check_mutant(entry, model, path)
            row["mutants"][mutation.name] = {**result, "where": list(mutant.where)}
    return row


# --- the run -------------------------------------------------------------------------------


def _versions() -> dict:
    from importlib import metadata

    names = ("keras", "keras-hub", "tensorflow", "onnx", "onnxruntime")
    return {name: metadata.version(name) for name in names}


def validator_state() -> dict:
    """Which validator and exporter were judged: the commit, a digest of
    validating.py as it was on disk, and the export's files that differed
    from the commit (the node order, and so which weight is first, follows
    the passes)."""
    export = ROOT / "keras_layers" / "export"
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run(
        [*git, "status", "--porcelain", str(export)], capture_output=True, text=True
    )
    return {
        "commit": head.stdout.strip() or None,
        "validating_py_sha256": hashlib.sha256((export / "validating.py").read_bytes()).hexdigest(),
        "uncommitted_export_files": [line[3:] for line in changed.stdout.splitlines()],
    }


def summary(report: dict) -> dict:
    """Kill rates per model and per mutation (killed over applied)."""
    per_model, per_mutation = {}, {}
    for row in report["models"]:
        for mutation, result in row.get("mutants", {}).items():
            if result["outcome"] == "not applicable":
                continue
            killed = result["outcome"] == "killed"
            for table, key in ((per_model, row["name"]), (per_mutation, mutation)):
                counts = table.setdefault(key, {"applied": 0, "killed": 0})
                counts["applied"] += 1
                counts["killed"] += killed
    return {"per_model": per_model, "per_mutation": per_mutation}


def _difference(result: dict) -> float | None:
    """The worst check's difference in the space it was judged in (the raw
    absolute one from a validator that reports no other)."""
    scaled = result.get("max_scaled_diff")
    return scaled if scaled is not None else result.get("max_abs_diff")


def _cell(result: dict) -> str:
    outcome = result["outcome"]
    if outcome == "not applicable":
        return "n/a"
    if outcome == "invalid mutant":
        return "INVALID"
    difference = _difference(result)
    label = "killed" if outcome == "killed" else "SURVIVED"
    return f"{label} {difference:.1e}" if difference is not None else label


def print_table(report: dict) -> None:
    names = [mutation["name"] for mutation in report["mutations"]]
    width = max(len(row["name"]) for row in report["models"]) + 2
    print(f"{'model':{width}}" + "".join(f"{name[:20]:>22}" for name in names))
    for row in report["models"]:
        if row["status"] != "exported":
            print(f"{row['name']:{width}}{row['status']}: {row['error']}")
            continue
        cells = [_cell(row["mutants"][name]) for name in names]
        print(f"{row['name']:{width}}" + "".join(f"{cell:>22}" for cell in cells))
    print("(the worst check's difference, in the space the validator compared it in)")
    for row in report["models"]:
        for mutation, result in row.get("mutants", {}).items():
            if result["outcome"] == "survived":
                print(
                    f"  SURVIVED: {row['name']} x {mutation}: {_difference(result):.2g} in "
                    f"{result.get('space', 'values')}, bound {result.get('bound') or 0:.2g} "
                    f"(unmutated: {_difference(row['baseline']):.2g})"
                )
            elif result["outcome"] == "invalid mutant":
                print(f"  INVALID: {row['name']} x {mutation}: {result['message']}")


def run(entries: list) -> list:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for number, entry in enumerate(entries, 1):
            row = run_model(entry, Path(folder))
            rows.append(row)
            outcomes = [result["outcome"] for result in row.get("mutants", {}).values()]
            counts = {outcome: outcomes.count(outcome) for outcome in sorted(set(outcomes))}
            print(f"[{number}/{len(entries)}] {entry.name}: {row['status']} {counts}", flush=True)
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the quick set of models")
    parser.add_argument("--models", nargs="+", metavar="NAME", help="only these models")
    parser.add_argument(
        "--no-conformance", action="store_true", help="leave out tests/conformance/'s models"
    )
    args = parser.parse_args(argv)
    # As the export command and the tests run TensorFlow: with its oneDNN
    # kernels, a Conv1D over fewer tokens than its kernel returns values
    # instead of failing, and the grid then holds lengths the file cannot take.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    if not args.no_conformance:
        register_conformance()
    if args.models:
        unknown = sorted(set(args.models) - set(MODELS))
        if unknown:
            raise SystemExit(f"not in MODELS: {', '.join(unknown)} (known: {', '.join(MODELS)})")
        entries = [MODELS[name] for name in args.models]
    else:
        entries = [entry for entry in MODELS.values() if entry.quick or not args.quick]
    partial = args.quick or bool(args.models)
    from keras_layers.export import validating

    report = run_header(Path(__file__).name, partial) | {
        "versions": _versions(),
        "validator": validator_state(),
        "tolerances": {"atol": validating.DEFAULT_ATOL, "rtol": validating.DEFAULT_RTOL},
        "mutations": [
            {"name": mutation.name, "description": mutation.description}
            for mutation in mutants.MUTATIONS
        ],
        "models": run(entries),
    }
    if args.models:
        report["command"] += " --models " + " ".join(args.models)
    report["summary"] = summary(report)
    print_table(report)
    stem = save_json(report, NAME, partial)
    print(f"wrote {stem}.json")
    return report


if __name__ == "__main__":
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
