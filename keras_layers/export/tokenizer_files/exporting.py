"""Write a keras-hub tokenizer (or a preprocessor's) as Hugging Face tokenizer files.

`write_tokenizer` is the writer: it resolves what it was given to a tokenizer
and, for a preprocessor, its framing; picks the family's converter
(`byte_pair`, `sentence_piece`, `word_piece`), refusing a tokenizer whose
tokenization is code of its own; adds the framing to the document; and writes
three files:

- `tokenizer.json`, read by `tokenizers` (Python, Rust, Node),
  transformers.js, onnxruntime-genai and onnxruntime-extensions;
- `tokenizer_config.json`, which onnxruntime-extensions and transformers read
  for the class (`tokenizer_class` picks onnxruntime-extensions'
  implementation), the special tokens, `add_bos_token` / `add_eos_token` (what
  onnxruntime-extensions adds when asked for special tokens), and
  `added_tokens_decoder`;
- `special_tokens_map.json`, the special tokens by role.

It returns a `TokenizerFiles` record; `check_identity` (identity.py) proves
the files encode as keras-hub does, and `export_tokenizer` (gate.py) writes,
proves and only then places them.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from keras_layers.export.errors import UsageError
from keras_layers.export.tokenizer_files.byte_pair import convert_byte_pair, special_token_roles
from keras_layers.export.tokenizer_files.converted import Converted
from keras_layers.export.tokenizer_files.framing import (
    Framing,
    known_gaps,
    post_processor,
    read_framing,
    truncation_and_padding,
)
from keras_layers.export.tokenizer_files.sentence_piece import convert_sentence_piece
from keras_layers.export.tokenizer_files.word_piece import convert_word_piece

# The methods that make each family's tokenization: a subclass that overrides
# one tokenizes with code of its own, which a tokenizer.json cannot carry.
_BEHAVIOUR = {
    "BytePairTokenizer": (
        "tokenize",
        "detokenize",
        "_tokenize_tokenizers",
        "_detokenize_tokenizers",
        "_set_vocabulary_and_merges_tokenizers",
        "_maybe_initialized_tokenizers",
        "_tokenize_tf",
        "_detokenize_tf",
        "_set_vocabulary_and_merges_tf",
        "_bpe_merge_and_update_cache_tf",
        "token_to_id",
        "id_to_token",
    ),
    "SentencePieceTokenizer": (
        "tokenize",
        "detokenize",
        "_tokenize_spm",
        "_detokenize_spm",
        "_set_proto_spm",
        "_tokenize_tf",
        "_detokenize_tf",
        "_set_proto_tf",
        "token_to_id",
        "id_to_token",
        "get_vocabulary",
        "vocabulary_size",
    ),
    "WordPieceTokenizer": (
        "tokenize",
        "detokenize",
        "_tokenize_python",
        "_detokenize_python",
        "_tokenize_word_python",
        "_tokenize_tf",
        "_detokenize_tf",
        "token_to_id",
        "id_to_token",
    ),
}
# The files `write_tokenizer` writes, in its order.
FILE_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_NO_VOCABULARY = {
    "BytePairTokenizer": "vocabulary",
    "SentencePieceTokenizer": "proto",
    "WordPieceTokenizer": "vocabulary",
}


@dataclass(frozen=True)
class TokenizerFiles:
    """What `write_tokenizer` wrote (and `export_tokenizer` placed).

    Attributes:
        folder: the folder holding the files.
        files: the files written, in the folder.
        family: the tokenizer family ("byte-level BPE", "SentencePiece unigram", ...).
        keras_class: the keras-hub tokenizer's class name.
        tokenizer_class: `tokenizer_config.json`'s class, which readers dispatch on.
        framing: the preprocessor's framing, or None for a tokenizer alone.
        known_gaps: reader -> what it is known to read differently.
        identity: the `IdentityReport` of the files, when they were checked.
    """

    folder: Path
    files: tuple
    family: str
    keras_class: str
    tokenizer_class: str
    framing: Framing | None = None
    known_gaps: dict = field(default_factory=dict)
    identity: object = None

    def report(self) -> dict:
        """The record as plain data (for JSON reports and the command line).

        Returns:
            A dict of strings, lists and None.
        """
        framing = None
        if self.framing is not None:
            framing = {
                "source": self.framing.source,
                "start": list(self.framing.start),
                "end": list(self.framing.end),
                "separator": None
                if self.framing.separator is None
                else list(self.framing.separator),
                "sequence_length": self.framing.sequence_length,
                "pad_token": self.framing.pad_token,
            }
        return {
            "folder": str(self.folder),
            "files": [path.name for path in self.files],
            "family": self.family,
            "keras_class": self.keras_class,
            "tokenizer_class": self.tokenizer_class,
            "framing": framing,
            "known_gaps": {reader: list(gaps) for reader, gaps in self.known_gaps.items()},
            "identity": None if self.identity is None else self.identity.report(),
        }


def resolve(tokenizer_or_preprocessor) -> tuple:
    """The tokenizer and (if given one) the preprocessor around it.

    Args:
        tokenizer_or_preprocessor: a keras-hub `Tokenizer` or `Preprocessor`.

    Returns:
        (tokenizer, preprocessor or None).

    Raises:
        UsageError: it is neither, or the preprocessor has no tokenizer.
    """
    from keras_hub.models import Preprocessor
    from keras_hub.tokenizers import Tokenizer

    given = tokenizer_or_preprocessor
    if isinstance(given, Tokenizer):
        return given, None
    if isinstance(given, Preprocessor):
        tokenizer = getattr(given, "tokenizer", None)
        if not isinstance(tokenizer, Tokenizer):
            raise UsageError(f"{type(given).__name__} has no keras-hub tokenizer to export")
        return tokenizer, given
    raise UsageError(
        f"export_tokenizer takes a keras-hub tokenizer or preprocessor; got {type(given).__name__}"
    )


def _family_base(tokenizer) -> str:
    from keras_hub import tokenizers

    for name in _BEHAVIOUR:
        if isinstance(tokenizer, getattr(tokenizers, name)):
            return name
    name = type(tokenizer).__name__
    why = {
        "ByteTokenizer": "its ids are raw UTF-8 byte values, with no vocabulary to write",
        "UnicodeCodepointTokenizer": "its ids are Unicode code points, with no vocabulary to write",
    }.get(name, "it is none of BytePairTokenizer, SentencePieceTokenizer, WordPieceTokenizer")
    raise UsageError(f"{name} cannot be written as tokenizer.json: {why}")


def convert(tokenizer) -> Converted:
    """The tokenizer in the `tokenizers` format, by its family's converter.

    Args:
        tokenizer: a keras-hub tokenizer.

    Returns:
        The conversion (the document has no framing yet).

    Raises:
        UsageError: the tokenizer is of no supported family, overrides its
            family's tokenization, has no vocabulary loaded, or pads to a
            `sequence_length` of its own.
    """
    from keras_hub import tokenizers

    base_name = _family_base(tokenizer)
    base = getattr(tokenizers, base_name)
    name = type(tokenizer).__name__
    overridden = [
        method
        for method in _BEHAVIOUR[base_name]
        if hasattr(base, method) and getattr(type(tokenizer), method) is not getattr(base, method)
    ]
    if overridden:
        raise UsageError(
            f"{name} overrides {', '.join(overridden)} of {base_name}: it tokenizes with code of "
            "its own, which tokenizer.json cannot express"
        )
    if getattr(tokenizer, _NO_VOCABULARY[base_name], None) is None:
        raise UsageError(
            f"{name} has no vocabulary loaded (its `{_NO_VOCABULARY[base_name]}` is None): "
            "build it with one or load it with `from_preset` before exporting"
        )
    if getattr(tokenizer, "sequence_length", None):
        raise UsageError(
            f"{name} pads and truncates to sequence_length={tokenizer.sequence_length} itself: "
            "build it with sequence_length=None, or export the preprocessor, whose framing "
            "(padding and truncation included) is written"
        )
    converter = {
        "BytePairTokenizer": convert_byte_pair,
        "SentencePieceTokenizer": convert_sentence_piece,
        "WordPieceTokenizer": convert_word_piece,
    }[base_name]
    return converter(tokenizer)


def _roles(converted: Converted, tokenizer, framing: Framing | None) -> dict:
    """The special tokens by role: the converter's (a SentencePiece proto's
    `<s>`), overridden by keras-hub's attributes (`start_token`), overridden by
    the single start / end token the preprocessor frames with: readers add
    `bos_token` / `eos_token` for `add_bos_token` / `add_eos_token`, so these
    must be the tokens keras-hub adds."""
    roles = {**converted.special_tokens, **special_token_roles(tokenizer)}
    if framing is not None:
        for role, tokens in (("bos_token", framing.start), ("eos_token", framing.end)):
            if len(tokens) == 1:
                roles[role] = tokens[0]
    return roles


def _frame(document: dict, converted: Converted, framing: Framing | None, tokenizer) -> None:
    start, end = converted.start_end
    if framing is not None and (start or end):
        raise UsageError(
            f"{type(tokenizer).__name__} adds its own start/end tokens (add_bos/add_eos) and the "
            "preprocessor adds its own: export the tokenizer alone"
        )
    if framing is None:
        document["post_processor"] = post_processor(
            (start,) if start else (), (end,) if end else (), None, tokenizer.token_to_id
        )
        return
    document["post_processor"] = post_processor(
        framing.start, framing.end, framing.separator, tokenizer.token_to_id
    )
    document["truncation"], document["padding"] = truncation_and_padding(
        framing, tokenizer.token_to_id
    )


def _config(converted: Converted, roles: dict, document: dict, framing: Framing | None) -> dict:
    start, end = converted.start_end
    starts = framing.start if framing else ((start,) if start else ())
    ends = framing.end if framing else ((end,) if end else ())
    config = {
        "tokenizer_class": converted.tokenizer_class,
        # What onnxruntime-extensions (and Llama-style readers) add when asked
        # for special tokens: the same tokens as the post-processor.
        "add_bos_token": roles.get("bos_token") in starts,
        "add_eos_token": roles.get("eos_token") in ends,
        # keras-hub never tidies spaces around punctuation when decoding.
        "clean_up_tokenization_spaces": False,
        **roles,
        "added_tokens_decoder": {
            str(entry["id"]): {key: value for key, value in entry.items() if key != "id"}
            for entry in document["added_tokens"]
        },
    }
    if framing is not None and framing.sequence_length:
        config["model_max_length"] = int(framing.sequence_length)
        config["padding_side"] = framing.padding_side
    config.update(converted.config)
    return config


def _write_json(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return path


def write_tokenizer(tokenizer_or_preprocessor, folder) -> TokenizerFiles:
    """Write a keras-hub tokenizer as Hugging Face tokenizer files, unchecked.

    Args:
        tokenizer_or_preprocessor: a keras-hub tokenizer (byte-level BPE,
            SentencePiece or WordPiece, any model subclass that keeps its
            family's tokenization), or a preprocessor, whose tokenizer is
            written with its framing (start/end tokens, truncation, padding).
        folder: the folder to write `tokenizer.json`, `tokenizer_config.json`
            and `special_tokens_map.json` to (created if missing).

    Returns:
        What was written, with the gaps each reader is known to have;
        `check_identity` measures them (`export_tokenizer` writes and checks).

    Raises:
        UsageError: the tokenizer cannot be written (another class, its own
            tokenization, no vocabulary) or the preprocessor's framing cannot.
    """
    tokenizer, preprocessor = resolve(tokenizer_or_preprocessor)
    converted = convert(tokenizer)
    framing = read_framing(preprocessor, tokenizer)
    document = dict(converted.document)
    _frame(document, converted, framing, tokenizer)
    roles = _roles(converted, tokenizer, framing)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    contents = (document, _config(converted, roles, document, framing), roles)
    files = tuple(
        _write_json(folder / name, content)
        for name, content in zip(FILE_NAMES, contents, strict=True)
    )
    return TokenizerFiles(
        folder=folder,
        files=files,
        family=converted.family,
        keras_class=type(tokenizer).__name__,
        tokenizer_class=converted.tokenizer_class,
        framing=framing,
        known_gaps=known_gaps(converted.known_gaps, framing),
    )
