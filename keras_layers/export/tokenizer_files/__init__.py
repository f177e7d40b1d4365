"""Hugging Face tokenizer files for keras-hub tokenizers, and the proof they match.

An exported model takes token ids; whoever deploys it needs the tokenizer
too. `export_tokenizer(tokenizer_or_preprocessor, folder)` writes a keras-hub
tokenizer (byte-level BPE, SentencePiece unigram or BPE, WordPiece) as
`tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json`, the
files `tokenizers`, transformers(.js), onnxruntime-genai and
onnxruntime-extensions read; given a preprocessor, its framing (start and end
tokens, truncation, padding) goes in too. Before the files are placed,
`check_identity(...)` encodes and decodes a stress corpus (`STRESS_CORPUS`)
with keras-hub and with each reader of the files, and every difference that
no known gap of the converter explains fails the export.

The stages read top to bottom: `converted` (the record a converter returns),
the three family converters, `framing`, `exporting` (the writer), `readers`,
`identity` (the proof), `gaps` (which differences a known gap explains) and
`gate` (write, prove, place). Each converter's module docstring says which
keras-hub rule maps to which `tokenizers` component, and what cannot.
"""

from keras_layers.export.tokenizer_files.corpus import STRESS_CORPUS
from keras_layers.export.tokenizer_files.exporting import TokenizerFiles
from keras_layers.export.tokenizer_files.gate import export_tokenizer
from keras_layers.export.tokenizer_files.identity import (
    Difference,
    IdentityReport,
    ReaderIdentity,
    check_identity,
)

__all__ = [
    "STRESS_CORPUS",
    "Difference",
    "IdentityReport",
    "ReaderIdentity",
    "TokenizerFiles",
    "check_identity",
    "export_tokenizer",
]
