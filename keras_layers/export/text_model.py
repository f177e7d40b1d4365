"""Encoders that take strings: a keras-hub text task and its preprocessor in one ONNX file.

`export_text_model(task, output)` exports a keras-hub `TextClassifier` (or any
task whose preprocessor tokenizes text and packs it with a
`MultiSegmentPacker`) as one ONNX file whose input is a batch of strings
(`text`, shape `(batch,)`, and `text_pair` with `pairs=True`) and whose
outputs are the task's. The design, stage by stage:

1. plan (`plan_text`): read the preprocessor (its tokenizer's family and
   flags, and the packer's framing through `tokenizer_files.framing`) into a
   `TextPlan`, refusing with a `UsageError` what an onnxruntime-extensions
   operator cannot express;
2. the model: `pipeline.export_model` exports the task itself, whose call
   takes token ids (the preprocessor only runs in `predict`), validated over
   its own grid, into a staging folder beside the output;
3. the tokenizer graph (`text_graph`): an ONNX `Loop` over the batch. Each
   step tokenizes one string with an onnxruntime-extensions operator, without
   special tokens: WordPiece with `BertTokenizer` (fed the vocabulary and
   keras-hub's lowercase / strip-accents flags; its `[CLS]`/`[SEP]` are cut
   off), byte-level BPE with `HfJsonTokenizer` (fed the `tokenizer.json` that
   `tokenizer_files.write_tokenizer` writes; step 5 proves the ids). The step then packs
   with standard ops as `MultiSegmentPacker` does: truncation to the
   sequence length less the special tokens (round robin or waterfall between
   a pair), start / separator / end tokens, segment ids, right padding with
   the pad id; the padding mask is `token_ids != pad_id`, keras-hub's rule.
   The loop makes the rows one fixed-length batch, whatever the operator
   does with batches (`BertTokenizer` takes one string or one pair only);
4. compose: `onnx.compose.merge_models` feeds the packed ids to the model;
5. validate (`check_text_model`), twice over: the tokenizer graph's ids,
   mask and segments must equal the preprocessor's exactly (the first text
   that differs is named with both id lists; the logits of other ids would
   prove nothing, so they are not compared then), and the composed file's
   outputs must match `task.predict(strings)` at the export's tolerances,
   on a batch of mixed lengths (padding), texts longer than the sequence
   length (truncation), one text alone, and pairs. The stress corpus
   (`tokenizer_files.STRESS_CORPUS`) is run through the operator too; the
   texts where it differs from keras-hub are listed in the report
   (`text.operator_differences`), not failed, since they are the operator's
   known gaps (below) and the export's own validation set is what must pass;
6. place: only when everything passed are the file and its report moved onto
   the user's paths (`placement`); a failure places nothing.

Running the file needs onnxruntime-extensions' operators registered:

    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(onnxruntime_extensions.get_library_path())

Known gaps of the operators (measured by the tests): `BertTokenizer`
emits the pieces it matched and `[UNK]` for the rest of a word whose pieces
run out, where keras-hub makes the whole word `[UNK]`; it also splits on
every Unicode whitespace, removes control characters and lowercases without
NFKC case folding (`tokenizer_files.word_piece.BERT_OP_GAP`). `HfJsonTokenizer`
reads a string as a C string: a U+0000 ends it.
"""

import json
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from keras_layers.export import loading, placement, validating
from keras_layers.export.errors import UsageError, ValidationFailed, argument
from keras_layers.export.options import ExportOptions
from keras_layers.export.pipeline import checked_options, export_model
from keras_layers.export.tokenizer_files import STRESS_CORPUS
from keras_layers.export.tokenizer_files.exporting import write_tokenizer
from keras_layers.export.tokenizer_files.framing import read_framing

TEXT_INPUT = "text"
PAIR_INPUT = "text_pair"
CONTRIB = "ai.onnx.contrib"
# Names inside the tokenizer graph carry this prefix: none can meet the model's.
_PREFIX = "text_model/"
# The packed inputs a keras-hub backbone takes, in the preprocessor's names.
PACKED = ("token_ids", "padding_mask", "segment_ids")
# Texts every export is validated on, besides the caller's: short and long,
# cased, punctuated, with accents the vocabulary may or may not hold.
SAMPLE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "a",
    "",
    "Machine learning models turn text into token ids, and back again!",
    "HELLO World: tokenizers split words into pieces (sometimes).",
    "the the the",
    "Café au lait, naïve façade.",
    "Numbers 123 and 4567 appear; so do e-mails like user@example.org.",
)
FAMILIES = {"WordPieceTokenizer": "BertTokenizer", "BytePairTokenizer": "HfJsonTokenizer"}


@dataclass(frozen=True)
class TextPlan:
    """What the tokenizer graph does, read from a keras-hub preprocessor.

    Attributes:
        operator: the onnxruntime-extensions operator (`FAMILIES`' values).
        attributes: the operator's attributes.
        start: ids before the first segment.
        end: ids after the last segment.
        separator: ids between two segments, or None when pairs are not framed.
        sequence_length: the packed length.
        pad_id: the padding id.
        truncate: `round_robin` or `waterfall` (between the two of a pair).
        source: the preprocessor's class name, for messages.
    """

    operator: str
    attributes: dict = field(repr=False)
    start: tuple
    end: tuple
    separator: tuple | None
    sequence_length: int
    pad_id: int
    truncate: str
    source: str


def _family(tokenizer) -> str:
    """The keras-hub base class of `tokenizer` that has an operator."""
    for base in type(tokenizer).__mro__:
        if base.__name__ in FAMILIES:
            return base.__name__
    raise UsageError(
        f"{type(tokenizer).__name__}: no onnxruntime-extensions operator is wired for its "
        f"tokenization (supported: {', '.join(FAMILIES)} and their subclasses)"
    )


def _word_piece_attributes(tokenizer) -> dict:
    """`BertTokenizer`'s attributes: the vocabulary and keras-hub's flags."""
    name = type(tokenizer).__name__
    if getattr(tokenizer, "special_tokens_in_strings", False) or not tokenizer.split:
        raise UsageError(
            f"{name}: special_tokens_in_strings=True or split=False has no counterpart in "
            "onnxruntime-extensions' BertTokenizer operator"
        )
    return {
        "vocab_file": "\n".join(tokenizer.get_vocabulary()),
        "do_lower_case": int(bool(tokenizer.lowercase)),
        "strip_accents": int(bool(tokenizer.strip_accents)),
        "tokenize_chinese_chars": int(bool(tokenizer.split_on_cjk)),
        "suffix_indicator": tokenizer.suffix_indicator,
        "unk_token": tokenizer.oov_token,
    }


def _json_attributes(tokenizer) -> dict:
    """`HfJsonTokenizer`'s attributes: the tokenizer's own files, unframed."""
    with tempfile.TemporaryDirectory() as folder:
        files = write_tokenizer(tokenizer, folder)
        text = {path.name: path.read_text(encoding="utf-8") for path in files.files}
    config = json.loads(text["tokenizer_config.json"])
    # The packer adds the special tokens; the operator must add none.
    config.update(add_bos_token=False, add_eos_token=False)
    return {"tokenizer_vocab": text["tokenizer.json"], "tokenizer_config": json.dumps(config)}


def plan_text(task_model) -> TextPlan:
    """Read `task_model`'s preprocessor into the plan of its tokenizer graph.

    Args:
        task_model: a keras-hub task with a text preprocessor.

    Returns:
        The plan.

    Raises:
        UsageError: no preprocessor, or one that no operator and packing can
            express (the message names it).
    """
    preprocessor = getattr(task_model, "preprocessor", None)
    if preprocessor is None or getattr(preprocessor, "tokenizer", None) is None:
        raise UsageError(
            f"{argument('preprocessor', True)}: {type(task_model).__name__} has no "
            "preprocessor with a tokenizer or an image converter (a keras-hub task built with "
            "preprocessor=...) to put in the file"
        )
    tokenizer, name = preprocessor.tokenizer, type(preprocessor).__name__
    family = _family(tokenizer)
    framing = read_framing(preprocessor, tokenizer)
    if framing.source.endswith("generate_preprocess") or not framing.sequence_length:
        raise UsageError(f"{name}: frames a prompt for generation, not text for an encoder")
    if framing.padding_side != "right" or framing.pad_token is None:
        raise UsageError(f"{name}: pads on the {framing.padding_side}; only right padding is built")
    if family == "WordPieceTokenizer":
        attributes = _word_piece_attributes(tokenizer)
    else:
        attributes = _json_attributes(tokenizer)

    def ids(tokens) -> tuple:
        return tuple(int(tokenizer.token_to_id(token)) for token in tokens)

    return TextPlan(
        operator=FAMILIES[family],
        attributes=attributes,
        start=ids(framing.start),
        end=ids(framing.end),
        separator=None if framing.separator is None else ids(framing.separator),
        sequence_length=int(framing.sequence_length),
        pad_id=int(tokenizer.token_to_id(framing.pad_token)),
        truncate=framing.truncate,
        source=name,
    )


class _Nodes:
    """Nodes of one graph, each output named `_PREFIX` + a counter."""

    def __init__(self):
        self.nodes: list = []
        self.initializers: list = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{_PREFIX}{hint}_{self._count}"

    def add(self, op: str, inputs: list, hint: str, outputs: int = 1, **attributes) -> list:
        from onnx import helper

        names = [self.name(hint) for _ in range(outputs)]
        domain = CONTRIB if op in FAMILIES.values() else ""
        self.nodes.append(helper.make_node(op, inputs, names, domain=domain, **attributes))
        return names

    def one(self, op: str, inputs: list, hint: str, **attributes) -> str:
        return self.add(op, inputs, hint, **attributes)[0]

    def ints(self, values, hint: str = "const") -> str:
        from onnx import numpy_helper

        name = self.name(hint)
        array = np.asarray(values, dtype=np.int64)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name


def _tokenize(nodes: _Nodes, plan: TextPlan, text: str) -> str:
    """The ids of one string (shape `[1]`), no special tokens: 1-D int64."""
    if plan.operator == "BertTokenizer":
        ids = nodes.add(plan.operator, [text], "bert", outputs=3, **plan.attributes)[0]
        # The operator always frames with [CLS] ... [SEP]: the packer frames.
        return nodes.one("Slice", [ids, nodes.ints([1]), nodes.ints([-1])], "unframed")
    ids = nodes.one(plan.operator, [text], "hf_json", **plan.attributes)
    return nodes.one("Reshape", [ids, nodes.ints([-1])], "ids")


def _kept(nodes: _Nodes, plan: TextPlan, lengths: list, budget: int) -> list:
    """How many ids of each segment survive truncation (shape-`[1]` int64s),
    as `MultiSegmentPacker` trims: round robin gives the first segment the
    odd token when both are long."""
    if len(lengths) == 1:
        return [nodes.one("Min", [lengths[0], nodes.ints([budget])], "kept")]
    first, second = lengths
    if plan.truncate == "round_robin":
        rest = nodes.one("Sub", [nodes.ints([budget]), second], "rest")
        share = nodes.one("Max", [nodes.ints([(budget + 1) // 2]), rest], "share")
        kept_first = nodes.one("Min", [first, share], "kept")
    else:
        kept_first = nodes.one("Min", [first, nodes.ints([budget])], "kept")
    left = nodes.one("Sub", [nodes.ints([budget]), kept_first], "left")
    return [kept_first, nodes.one("Min", [second, left], "kept")]


def _filled(nodes: _Nodes, length: str, value: int) -> str:
    from onnx import TensorProto, helper

    fill = helper.make_tensor("value", TensorProto.INT64, [1], [value])
    return nodes.one("ConstantOfShape", [length], "fill", value=fill)


def _pack(nodes: _Nodes, plan: TextPlan, segments: list) -> tuple:
    """One packed row: (token ids, segment ids), each of `sequence_length`."""
    separator = plan.separator or ()
    budget = plan.sequence_length - len(plan.start) - len(plan.end)
    budget -= len(separator) * (len(segments) - 1)
    lengths = [nodes.one("Shape", [ids], "length") for ids in segments]
    kept = _kept(nodes, plan, lengths, budget)
    pieces, segment_lengths = [nodes.ints(plan.start, "start")], []
    for index, (ids, count) in enumerate(zip(segments, kept, strict=True)):
        pieces.append(nodes.one("Slice", [ids, nodes.ints([0]), count], "cut"))
        last = index == len(segments) - 1
        after = plan.end if last else separator
        pieces.append(nodes.ints(after, "end" if last else "separator"))
        extra = len(after) + (len(plan.start) if index == 0 else 0)
        segment_lengths.append(nodes.one("Add", [count, nodes.ints([extra])], "span"))
    row = nodes.one("Concat", pieces, "row", axis=0)
    segment_ids = nodes.one(
        "Concat",
        [_filled(nodes, span, index) for index, span in enumerate(segment_lengths)],
        "segments",
        axis=0,
    )
    length = nodes.one("Shape", [row], "n")
    missing = nodes.one("Sub", [nodes.ints([plan.sequence_length]), length], "gap")
    pads = nodes.one("Concat", [nodes.ints([0]), missing], "pads", axis=0)
    padded = nodes.one("Pad", [row, pads, nodes.ints(plan.pad_id, "pad_id")], "padded")
    return padded, nodes.one("Pad", [segment_ids, pads, nodes.ints(0, "zero")], "padded")


def _loop_body(plan: TextPlan, inputs: list):
    """The loop's body: tokenize and pack the strings at index `i`."""
    from onnx import TensorProto, helper

    nodes = _Nodes()
    index = nodes.one("Unsqueeze", ["i", nodes.ints([0])], "index")
    following = nodes.one("Add", [index, nodes.ints([1])], "next")
    segments = [
        _tokenize(nodes, plan, nodes.one("Slice", [name, index, following], "string"))
        for name in inputs
    ]
    row, segment_ids = _pack(nodes, plan, segments)
    nodes.nodes.append(helper.make_node("Identity", ["cond"], ["cond_out"]))
    nodes.nodes.append(helper.make_node("Identity", [row], ["row"]))
    nodes.nodes.append(helper.make_node("Identity", [segment_ids], ["row_segments"]))
    length = [plan.sequence_length]
    return helper.make_graph(
        nodes.nodes,
        "pack",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("row", TensorProto.INT64, length),
            helper.make_tensor_value_info("row_segments", TensorProto.INT64, length),
        ],
        initializer=nodes.initializers,
    )


def text_graph(plan: TextPlan, model_inputs: dict, pairs: bool = False, opset: int = 17):
    """The tokenizer graph: strings in, the model's packed inputs out.

    Args:
        plan: what to tokenize and pack (`plan_text`).
        model_inputs: the model's input names -> ONNX element types; each
            must be one of `PACKED`.
        pairs: take a second string input (`PAIR_INPUT`) packed after the first.
        opset: the default domain's opset (the model's, for composing).

    Returns:
        The graph as an `onnx.ModelProto`.

    Raises:
        UsageError: an input no preprocessor makes, or pairs the packer
            does not frame.
    """
    from onnx import TensorProto, helper

    unknown = sorted(set(model_inputs) - set(PACKED))
    if unknown:
        raise UsageError(f"{plan.source}: the model takes {unknown}, which it does not make")
    if pairs and plan.separator is None:
        raise UsageError(f"{argument('pairs', True)}: {plan.source} does not frame pairs")
    inputs = [TEXT_INPUT, PAIR_INPUT] if pairs else [TEXT_INPUT]
    nodes = _Nodes()
    count = nodes.one("Gather", [nodes.one("Shape", [TEXT_INPUT], "shape"), nodes.ints(0)], "n")
    ids, segment_ids = nodes.add(
        "Loop", [count, ""], "packed", outputs=2, body=_loop_body(plan, inputs)
    )
    mask = nodes.one("Not", [nodes.one("Equal", [ids, nodes.ints(plan.pad_id)], "is_pad")], "mask")
    made = {"token_ids": ids, "padding_mask": mask, "segment_ids": segment_ids}
    outputs = []
    for name, element_type in model_inputs.items():
        nodes.nodes.append(helper.make_node("Cast", [made[name]], [name], to=element_type))
        batch = helper.make_tensor_value_info(name, element_type, ["batch", plan.sequence_length])
        outputs.append(batch)
    graph = helper.make_graph(
        nodes.nodes,
        "text_model",
        [helper.make_tensor_value_info(name, TensorProto.STRING, ["batch"]) for name in inputs],
        outputs,
        initializer=nodes.initializers,
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(CONTRIB, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def compose(text, model):
    """The tokenizer graph feeding the model: one file, strings in.

    Args:
        text: the tokenizer graph (`text_graph`), its outputs named as the
            model's inputs.
        model: the exported model.

    Returns:
        The composed `onnx.ModelProto`. Both graphs' opset imports are made
        the union of the two (`merge_models` wants them equal); nothing else
        in them is changed.
    """
    from onnx import compose as onnx_compose
    from onnx import helper

    text.ir_version = model.ir_version
    domains = {entry.domain: entry.version for entry in text.opset_import}
    for entry in model.opset_import:
        domains.setdefault(entry.domain, entry.version)
    del text.opset_import[:]
    text.opset_import.extend(helper.make_opsetid(d, v) for d, v in domains.items())
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in domains.items())
    io_map = [(entry.name, entry.name) for entry in model.graph.input]
    return onnx_compose.merge_models(text, model, io_map=io_map)


@dataclass
class TextValidation:
    """What `check_text_model` found.

    Attributes:
        texts: how many texts (and pairs) were run.
        ids_difference: the first row whose packed inputs differ from the
            preprocessor's (`text`, `pair`, `input`, `keras`, `onnx`), or None.
        checks: the composed file's outputs against `predict`, per batch.
        operator_differences: the stress-corpus texts whose ids the operator
            makes differently from keras-hub (the operator's known gaps).
    """

    texts: int
    ids_difference: dict | None
    checks: list
    operator_differences: list

    @property
    def passed(self) -> bool:
        checked = self.ids_difference is None and bool(self.checks)
        return checked and all(check.passed for check in self.checks)

    def failure(self) -> str:
        """The first failure, in words ("" when all passed)."""
        if self.ids_difference is not None:
            d = self.ids_difference
            pair = "" if d["pair"] is None else f" paired with {d['pair']!r}"
            return (
                f"the tokenizer graph's {d['input']} for {d['text']!r}{pair} differ from the "
                f"preprocessor's: keras-hub {d['keras']}, ONNX {d['onnx']}"
            )
        for check in self.checks:
            if not check.passed:
                detail = check.problem or f"max abs diff {check.max_abs_diff:.3g}"
                return f"{check.output} on {check.shape} differs from predict ({detail})"
        return ""


def _session(proto):
    """An ONNX Runtime session with onnxruntime-extensions' operators."""
    import onnxruntime
    from onnxruntime_extensions import get_library_path

    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    return onnxruntime.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _feeds(texts: list, pairs: list | None) -> dict:
    feeds = {TEXT_INPUT: np.array(texts, dtype=object)}
    if pairs is not None:
        feeds[PAIR_INPUT] = np.array(pairs, dtype=object)
    return feeds


def _keras_packed(preprocessor, texts: list, pairs: list | None) -> dict:
    import tensorflow as tf

    x = tf.constant(texts) if pairs is None else (tf.constant(texts), tf.constant(pairs))
    return {name: np.asarray(value) for name, value in preprocessor(x=x).items()}


def _keras_predicted(task_model, texts: list, pairs: list | None) -> list:
    import tensorflow as tf

    if pairs is None:
        predicted = task_model.predict(list(texts), verbose=0)
    else:
        rows = tf.data.Dataset.from_tensor_slices(((tf.constant(texts), tf.constant(pairs)),))
        predicted = task_model.predict(rows.batch(len(texts)), verbose=0)
    if isinstance(predicted, dict):
        return list(predicted.values())
    return list(predicted) if isinstance(predicted, list | tuple) else [predicted]


def _ids_difference(text_session, preprocessor, texts: list, pairs: list | None) -> dict | None:
    """The first row whose packed inputs differ from the preprocessor's."""
    got = dict(
        zip(
            [o.name for o in text_session.get_outputs()],
            text_session.run(None, _feeds(texts, pairs)),
            strict=True,
        )
    )
    expected = _keras_packed(preprocessor, texts, pairs)
    for row, text in enumerate(texts):
        for name, values in got.items():
            keras = expected[name][row].astype(np.int64)
            onnx_row = values[row].astype(np.int64)
            if keras.shape != onnx_row.shape or (keras != onnx_row).any():
                return {
                    "text": text,
                    "pair": None if pairs is None else pairs[row],
                    "input": name,
                    "keras": keras.tolist(),
                    "onnx": onnx_row.tolist(),
                }
    return None


def _operator_differences(plan: TextPlan, tokenizer, corpus) -> list:
    """The corpus texts the operator tokenizes differently from keras-hub."""
    from onnx import TensorProto, helper

    nodes = _Nodes()
    ids = _tokenize(nodes, plan, TEXT_INPUT)
    nodes.nodes.append(helper.make_node("Identity", [ids], ["ids"]))
    graph = helper.make_graph(
        nodes.nodes,
        "tokenize",
        [helper.make_tensor_value_info(TEXT_INPUT, TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
        initializer=nodes.initializers,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)]
    session = _session(helper.make_model(graph, opset_imports=opsets))
    differ = []
    for text in corpus:
        keras = [int(i) for i in np.asarray(tokenizer.tokenize(text)).reshape(-1)]
        try:
            got = session.run(None, _feeds([text], None))[0].tolist()
        except Exception:  # noqa: BLE001 - onnxruntime's own types: the operator refused it
            got = None
        if got != keras:
            differ.append(text)
    return differ


def validation_texts(plan: TextPlan, texts=()) -> list:
    """The texts an export is validated on: `SAMPLE_TEXTS`, the caller's,
    and one longer than the sequence length, so that truncation is run.

    Args:
        plan: the plan (for the sequence length).
        texts: the caller's texts.

    Returns:
        The texts.
    """
    long = " ".join([SAMPLE_TEXTS[0]] * plan.sequence_length)
    return [*SAMPLE_TEXTS, *texts, long]


def check_text_model(
    task_model,
    plan: TextPlan,
    text,
    composed,
    texts: list,
    pairs: bool = False,
    options=None,
    corpus=STRESS_CORPUS,
) -> TextValidation:
    """Prove the tokenizer graph and the composed file against keras-hub.

    Args:
        task_model: the keras-hub task, its preprocessor attached.
        plan: the plan the tokenizer graph was built from.
        text: the tokenizer graph (`text_graph`).
        composed: the composed file's `onnx.ModelProto`.
        texts: the texts to run (paired with the next text with `pairs`).
        pairs: whether the graphs take pairs.
        options: the export's `ExportOptions` (tolerances), or None.
        corpus: texts whose raw tokenization by the operator is compared
            with keras-hub's and reported, not failed.

    Returns:
        The validation; `passed` is False on any difference. When the ids
        differ, the logits are not compared (`checks` is empty).
    """
    options = checked_options(options)
    preprocessor = task_model.preprocessor
    second = [*texts[1:], texts[0]] if pairs else None
    batches = [(list(texts), second), (list(texts[:1]), None if second is None else second[:1])]
    difference = None
    text_session = _session(text)
    for batch, paired in batches:
        difference = difference or _ids_difference(text_session, preprocessor, batch, paired)
    differences = _operator_differences(plan, preprocessor.tokenizer, corpus)
    if difference is not None:  # the logits of other ids prove nothing more
        return TextValidation(len(texts), difference, [], differences)
    # One `predict` (its tf.data tracing is most of the time): the rows are
    # independent, so the batch of one is judged by the first row.
    predicted = _keras_predicted(task_model, *batches[0])
    session, checks = _session(composed), []
    if len(predicted) != len(session.get_outputs()):
        problem = f"predict returns {len(predicted)} outputs, the file {len(session.get_outputs())}"
        checks.append(validating.Check("all", "outputs", np.inf, np.inf, False, problem=problem))
    for batch, paired in batches:
        got = session.run(None, _feeds(batch, paired))
        expected = [np.asarray(value)[: len(batch)] for value in predicted]
        label = f"{len(batch)} {'pairs' if paired else 'texts'}"
        for output, value, reference in zip(session.get_outputs(), got, expected, strict=False):
            checks.append(
                validating.compare(label, output.name, value, reference, options.atol, options.rtol)
            )
    return TextValidation(len(texts), None, checks, differences)


def _input_types(model) -> dict:
    return {entry.name: entry.type.tensor_type.elem_type for entry in model.graph.input}


def _default_opset(model) -> int:
    return next(e.version for e in model.opset_import if e.domain in ("", "ai.onnx"))


def _text_report(report: dict, targets, plan: TextPlan, validation: TextValidation, pairs: bool):
    report = dict(report, onnx_path=str(targets.onnx), report_path=str(targets.report))
    report["passed"] = report["passed"] and validation.passed
    report["text"] = {
        "inputs": [TEXT_INPUT, PAIR_INPUT] if pairs else [TEXT_INPUT],
        "operator": plan.operator,
        "preprocessor": plan.source,
        "sequence_length": plan.sequence_length,
        "texts_checked": validation.texts,
        "passed": validation.passed,
        "failure": validation.failure() or None,
        "ids_difference": validation.ids_difference,
        "checks": [asdict(check) for check in validation.checks],
        "operator_differences": validation.operator_differences,
        "custom_ops": "register onnxruntime_extensions.get_library_path() in the session",
    }
    return report


def _ids_options(options: ExportOptions, folder: Path, shapes: list) -> ExportOptions:
    """The options of the model's own export (token ids in), in the staging folder."""
    return replace(
        options,
        report_path=folder / "ids.report.json",
        external_data="never",
        shapes=shapes,
        preprocessor=False,
        text_pairs=False,
    )


def export_text_model(
    task_model, output, options: ExportOptions | None = None, *, pairs: bool = False, texts=()
) -> dict:
    """Export a keras-hub text task with its preprocessor: strings in, outputs out.

    Args:
        task_model: a keras-hub task (a `TextClassifier`) with its
            preprocessor, or the path of a `.keras` file holding one.
        output: the ONNX file to write.
        options: the export's `ExportOptions`; without `shapes`, the model is
            validated at the preprocessor's sequence length.
        pairs: take a second string input, `text_pair`, packed after `text`.
        texts: more texts to validate on, besides `SAMPLE_TEXTS` (with
            `pairs`, each text is paired with the next).

    Returns:
        The report: `export_model`'s for the model, with a `text` entry.

    Raises:
        UsageError: no preprocessor, or one no operator expresses;
            `external_data="always"` (the composed file holds its weights);
            `texts` not a list of strings.
        ValidationFailed: the model (ids in) fails its own validation, or
            the tokenizer graph's ids or the composed file's outputs differ
            from keras-hub's; nothing is placed. The message names the first
            differing text with both id lists; `error.report` has them all.
    """
    import onnx

    output, options = Path(output), checked_options(options)
    if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
        raise UsageError(f"{argument('texts', texts)}: give a list of strings")
    if isinstance(task_model, str | Path):
        loaded = loading.load(task_model, imports=options.imports, unsafe=options.unsafe)
        task_model = loaded.model
    plan = plan_text(task_model)
    if pairs and plan.separator is None:
        raise UsageError(f"{argument('pairs', True)}: {plan.source} does not frame pairs")
    if options.external_data == "always":
        raise UsageError(
            f"{argument('external_data', 'always')}: a file with its preprocessor keeps its "
            "weights in the graph"
        )
    targets = placement.Targets(
        onnx=output, report=options.report_path or placement.default_report_path(output)
    )
    placement.check_targets(targets, None)
    shapes = options.shapes or [(1, plan.sequence_length), (2, plan.sequence_length), "padded"]
    with placement.staging_folder(output) as folder:
        inner = _ids_options(options, folder, shapes)
        try:
            report = export_model(task_model, folder / "ids.onnx", inner)
        except ValidationFailed as error:
            raise ValidationFailed(
                f"the model (token ids in) failed its own validation, so nothing was placed: "
                f"{error}",
                error.report,
            ) from error
        model = onnx.load(str(folder / "ids.onnx"))
        text = text_graph(plan, _input_types(model), pairs, _default_opset(model))
        composed = compose(text, model)
        all_texts = validation_texts(plan, texts)
        validation = check_text_model(task_model, plan, text, composed, all_texts, pairs, options)
        report = _text_report(report, targets, plan, validation, pairs)
        if not validation.passed:
            raise ValidationFailed(
                f"validation failed: {validation.failure()}. Nothing was placed.", report
            )
        onnx.save_model(composed, str(folder / "text_model.onnx"))
        placement.write_json(report, folder / "report.json")
        with placement.output_lock(output):
            placement.place(
                [(folder / "text_model.onnx", output), (folder / "report.json", targets.report)]
            )
    return report
