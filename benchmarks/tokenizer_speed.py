"""Every zoo model's tokenizer: exported, proved token-identical, and timed side by side.

    python benchmarks/tokenizer_speed.py  # every class: identity and speed (about a minute)
    python benchmarks/tokenizer_speed.py --quick  # a smoke run: one class per family, 3 rounds

The tokenizer classes are those of tests/zoo_tokenizers.py (the zoo tests
import the same module): the tokenizer of every keras-hub text model of the
zoo, each built with a vocabulary trained there (byte-level BPE, SentencePiece
BPE with byte fallback, WordPiece). Per class:

- identity: the files written, then `check_identity` on the stress corpus
  (what `export_tokenizer`'s gate runs); per reader (`tokenizers`,
  onnxruntime-extensions) the comparisons, the differences, how many of them
  the reader's known gaps explain (each gap is a test on one difference, in
  tokenizer_files/gaps.py), and the gaps listed; or the class refused, with
  the writer's reason;
- speed: strings per second on the stress corpus (every text, in batches of 1
  and of 32), for keras-hub's tokenizer called eagerly as users call it
  (`tokenizer(texts)`), the `tokenizers` library on the written file
  (`encode_batch`), onnxruntime-extensions' `pp_api` on the folder
  (`batch_tokenize`; it has no WordPiece reader), and an ONNX graph holding
  onnxruntime-extensions' tokenizer operator run in onnxruntime, which is
  what a deployed model's preprocessing graph runs: `GPT2Tokenizer` fed the
  file's vocabulary and merges, `SentencepieceTokenizer` fed the proto,
  `BertTokenizer` fed the file's vocabulary (readers.py builds it). The
  graph's ids are compared with keras-hub's on every text too (`graph same`).

The candidates are interleaved round by round and the medians compared in the
same run (benchmarks/timing.py); the ratios are each engine's strings/s over
keras-hub's. Writes results/tokenizers[.quick].json; docs/tokenizers.md's
tables and the zoo table's tokenizer column (docs/models.md) are rendered from
it by benchmarks/docs_tables.py.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on the path, and this file
# (tokenizers.py) would shadow the `tokenizers` library keras-hub imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # zoo_tokenizers lives with the tests that use it

# onnxruntime-extensions' `SentencepieceTokenizer` operator crashes the process
# (a segmentation fault creating the session) when TensorFlow's libraries were
# loaded before onnxruntime-extensions' (measured with onnxruntime 1.32,
# onnxruntime-extensions 0.15.2, TensorFlow 2.21). Run as a script, this module
# loads it first; imported where TensorFlow already is (the smoke test), the
# SentencePiece graph is left out, and the report says so.
SENTENCE_PIECE_GRAPH = "tensorflow" not in sys.modules
NO_SENTENCE_PIECE_GRAPH = (
    "TensorFlow was loaded before onnxruntime-extensions, and its SentencepieceTokenizer "
    "operator then crashes the process: run benchmarks/tokenizer_speed.py as a script"
)
import onnxruntime_extensions  # noqa: E402, F401  (before TensorFlow: see above)
import zoo_tokenizers  # noqa: E402

from benchmarks.results_io import run_header, save_json  # noqa: E402
from benchmarks.timing import time_side_by_side  # noqa: E402

BATCHES = (1, 32)
ROUNDS, QUICK_ROUNDS = 15, 3
ENGINES = ("keras-hub", "tokenizers", "ort-extensions pp_api", "onnxruntime graph")


def _reader_row(result) -> dict:
    """One reader's identity, as the table shows it."""
    measured_only = result.measured_only
    explained = len(result.differences) - len(result.unexplained)
    return {
        "identical": result.identical,
        "compared": result.compared,
        "differences": len(result.differences),
        "explained_by_known_gaps": explained,
        "known_gaps": list(result.known_gaps),
        "measured_only": measured_only,
        "not_checked": list(result.not_checked),
        "error": result.error,
        "first": None if result.first is None else result.first.describe()[:300],
    }


def identity(name: str, folder: Path) -> tuple:
    """(row, tokenizer or None): the class exported and checked, or its refusal.

    Args:
        name: a tokenizer class of the zoo.
        folder: where to write its files.

    Returns:
        The identity row, and the tokenizer when it was exported.
    """
    from keras_layers.export.errors import UsageError
    from keras_layers.export.tokenizer_files import check_identity
    from keras_layers.export.tokenizer_files.exporting import write_tokenizer

    tokenizer = zoo_tokenizers.instance(name)
    try:  # written and checked apart: a failed check is measured here, not raised
        written = write_tokenizer(tokenizer, folder)
    except UsageError as error:
        return {"refused": str(error)}, None
    report = check_identity(tokenizer, folder)
    row = {
        "refused": None,
        "tokenizer_family": written.family,
        "tokenizer_class": written.tokenizer_class,
        "texts": report.texts,
        "readers": {result.reader: _reader_row(result) for result in report.readers},
    }
    return row, tokenizer


# --- the engines timed ---------------------------------------------------------------------


def _session(model):
    import onnxruntime
    from onnxruntime_extensions import get_library_path

    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _opsets():
    from onnx import helper

    return [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]


def byte_pair_graph(folder: Path):
    """onnxruntime-extensions' `GPT2Tokenizer` operator, fed the file's vocabulary and merges."""
    from onnx import TensorProto, helper

    model = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    merges = "\n".join(m if isinstance(m, str) else " ".join(m) for m in model["merges"])
    node = helper.make_node(
        "GPT2Tokenizer",
        ["text"],
        ["input_ids", "attention_mask"],
        domain="ai.onnx.contrib",
        vocab=json.dumps(model["vocab"], ensure_ascii=False),
        merges=merges,
        padding_length=-1,
    )
    text = helper.make_tensor_value_info("text", TensorProto.STRING, [None])
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, [None, None]) for name in node.output
    ]
    graph = helper.make_graph([node], "byte_pair", [text], outputs)
    return helper.make_model(graph, opset_imports=_opsets())


def sentence_piece_graph(proto: bytes):
    """onnxruntime-extensions' `SentencepieceTokenizer` operator, fed the proto (no bos/eos)."""
    from onnx import TensorProto, helper

    values = [
        ("nbest_size", TensorProto.INT64, 0),
        ("alpha", TensorProto.FLOAT, 0.0),
        ("add_bos", TensorProto.BOOL, False),
        ("add_eos", TensorProto.BOOL, False),
        ("reverse", TensorProto.BOOL, False),
    ]
    constants = [
        helper.make_node("Constant", [], [n], value=helper.make_tensor(n, kind, [1], [v]))
        for n, kind, v in values
    ]
    node = helper.make_node(
        "SentencepieceTokenizer",
        ["text", *(n for n, _, _ in values)],
        ["tokens", "indices"],
        domain="ai.onnx.contrib",
        model=proto,
    )
    text = helper.make_tensor_value_info("text", TensorProto.STRING, [None])
    outputs = [
        helper.make_tensor_value_info("tokens", TensorProto.INT32, [None]),
        helper.make_tensor_value_info("indices", TensorProto.INT64, [None]),
    ]
    graph = helper.make_graph([*constants, node], "sentence_piece", [text], outputs)
    return helper.make_model(graph, opset_imports=_opsets())


def graph_encoder(family: str, tokenizer, folder: Path):
    """A function: list of texts -> list of id lists, by an ONNX graph in onnxruntime.

    Args:
        family: the keras-hub base class's name.
        tokenizer: the keras-hub tokenizer (its proto, for SentencePiece).
        folder: the exported files.

    Returns:
        The function, or None where the graph cannot run in this process
        (`SENTENCE_PIECE_GRAPH`).
    """
    import numpy as np

    if family == "WordPieceTokenizer":
        from keras_layers.export.tokenizer_files.readers import BertOperatorReader

        reader = BertOperatorReader(folder, False)
        return lambda texts: [reader.encode(text) for text in texts]
    if family == "SentencePieceTokenizer":
        if not SENTENCE_PIECE_GRAPH:
            return None
        session = _session(sentence_piece_graph(tokenizer.proto))

        def encode(texts):
            tokens, rows = session.run(None, {"text": np.array(texts, dtype=object)})
            return [tokens[rows[i] : rows[i + 1]].tolist() for i in range(len(texts))]

        return encode
    session = _session(byte_pair_graph(folder))

    def encode_padded(texts):
        ids, mask = session.run(None, {"text": np.array(texts, dtype=object)})
        return [row[kept.astype(bool)].tolist() for row, kept in zip(ids, mask, strict=True)]

    return encode_padded


def engines(family: str, tokenizer, folder: Path) -> dict:
    """Engine name -> a function tokenizing one batch (a list of texts).

    Args:
        family: the keras-hub base class's name.
        tokenizer: the keras-hub tokenizer.
        folder: the exported files.

    Returns:
        The functions, keras-hub first; onnxruntime-extensions' pp_api only
        where it reads the family.
    """
    from tokenizers import Tokenizer

    library = Tokenizer.from_file(str(folder / "tokenizer.json"))
    library.no_padding()
    library.no_truncation()
    found = {
        "keras-hub": lambda texts: tokenizer(texts),
        "tokenizers": lambda texts: library.encode_batch(texts, add_special_tokens=False),
    }
    if family != "WordPieceTokenizer":
        from onnxruntime_extensions import pp_api

        loaded = pp_api.Tokenizer(str(folder), {"add_special_tokens": False})
        found["ort-extensions pp_api"] = lambda texts: pp_api.batch_tokenize(
            loaded.tokenizer, texts
        )
    graph = graph_encoder(family, tokenizer, folder)
    if graph is not None:
        found["onnxruntime graph"] = graph
    return found


def _batches(texts: list, size: int) -> list:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def speed(functions: dict, texts: list, rounds: int) -> dict:
    """Strings per second of each engine at each batch size, and the ratios to keras-hub.

    Args:
        functions: engine name -> function tokenizing a batch.
        texts: the texts, all tokenized once per timed call.
        rounds: rounds of the side-by-side timing (the median is kept).

    Returns:
        batch size -> {"strings_per_s": {engine: n}, "vs_keras_hub": {engine: ratio}}.
    """
    result = {}
    for size in BATCHES:
        batches = _batches(texts, size)
        candidates = {
            name: (lambda f=function, b=batches: [f(batch) for batch in b])
            for name, function in functions.items()
        }
        timing = time_side_by_side(candidates, rounds=rounds, calls=1, warmup=1)
        rates = {name: len(texts) / (t["median_ms"] / 1000) for name, t in timing.items()}
        result[str(size)] = {
            "strings_per_s": {name: round(rate, 1) for name, rate in rates.items()},
            "vs_keras_hub": {
                name: round(rate / rates["keras-hub"], 2)
                for name, rate in rates.items()
                if name != "keras-hub"
            },
        }
    return result


def measure(entry, quick: bool, timed: bool) -> dict:
    """One class's row: family, the zoo models it serves, identity, and speed if `timed`.

    Args:
        entry: a `ZooTokenizer`.
        quick: fewer rounds.
        timed: whether to time it.

    Returns:
        The row.
    """
    from keras_layers.export.tokenizer_files import STRESS_CORPUS

    row = {"name": entry.name, "family": entry.family, "models": list(entry.models)}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        found, tokenizer = identity(entry.name, folder)
        row |= found
        if tokenizer is None:
            return row
        texts = list(STRESS_CORPUS)
        keras = [[int(i) for i in tokenizer.tokenize(text)] for text in texts]
        graph = graph_encoder(entry.family, tokenizer, folder)
        row["graph_same"] = None
        if graph is not None:
            row["graph_same"] = sum(a == b for a, b in zip(graph(texts), keras, strict=True))
        if timed:
            functions = engines(entry.family, tokenizer, folder)
            row["speed"] = speed(functions, texts, QUICK_ROUNDS if quick else ROUNDS)
    return row


def _cell(row: dict, reader: str) -> str:
    if row.get("refused"):
        return "refused"
    result = row["readers"][reader]
    if result["identical"]:
        return "identical"
    return f"{result['differences']} diff ({result['explained_by_known_gaps']} known)"


def print_table(report: dict) -> None:
    """The identity of every class, then the speed of those timed."""
    print(f"{'class':24} {'family':24} {'tokenizers':22} {'onnxruntime-extensions':22}")
    for row in report["tokenizers"]:
        print(
            f"{row['name']:24} {row['family']:24} {_cell(row, 'tokenizers'):22} "
            f"{_cell(row, 'onnxruntime-extensions'):22}"
        )
    for row in report["tokenizers"]:
        for size, timing in row.get("speed", {}).items():
            rates = ", ".join(f"{k} {v:,.0f}" for k, v in timing["strings_per_s"].items())
            print(f"{row['name']} batch {size}: strings/s {rates}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="one class per family, 3 rounds (a smoke run)"
    )
    args = parser.parse_args(argv)
    from keras_layers.export.tokenizer_files import STRESS_CORPUS

    start = time.perf_counter()
    chosen = set(zoo_tokenizers.representatives().values())
    entries = [
        entry
        for entry in zoo_tokenizers.enumerate_tokenizers()
        if not args.quick or entry.name in chosen
    ]
    report = run_header("tokenizers.py", args.quick) | {
        "corpus_texts": len(STRESS_CORPUS),
        "batches": list(BATCHES),
        "rounds": QUICK_ROUNDS if args.quick else ROUNDS,
        "engines": list(ENGINES),
        "sentence_piece_graph": None if SENTENCE_PIECE_GRAPH else NO_SENTENCE_PIECE_GRAPH,
        "tokenizers": [measure(entry, args.quick, timed=True) for entry in entries],
    }
    report["seconds"] = round(time.perf_counter() - start, 1)
    print_table(report)
    print(f"wrote {save_json(report, 'tokenizers', args.quick)}.json ({report['seconds']} s)")
    return report


if __name__ == "__main__":
    main()
