"""The tokenizer stage of an export: write the files, prove them, and only then place them.

`export_tokenizer` writes the files into a private staging folder
(`write_tokenizer`), runs `check_identity` on the stress corpus with every
reader, and judges each difference (gaps.py): one that no known gap explains
fails the export with `ValidationFailed` (exit 1 on the command line), naming
the first differing text with both id lists, and nothing is placed. Passed,
the three files are moved into the folder, each by an atomic rename, under
the same lock and rules as an ONNX export's files (placement.py): the folder
holds its old files or the new ones, never a mix, and nothing else in it is
touched.
"""

import tempfile
from dataclasses import replace
from pathlib import Path

from keras_layers.export import placement
from keras_layers.export.errors import OutputError, UsageError, ValidationFailed, argument
from keras_layers.export.tokenizer_files.corpus import STRESS_CORPUS
from keras_layers.export.tokenizer_files.exporting import TokenizerFiles, write_tokenizer
from keras_layers.export.tokenizer_files.identity import check_identity


def check_folder(folder) -> Path:
    """The folder to write tokenizer files to, refused before any work if it cannot be.

    Args:
        folder: the folder (created when the files are placed, if missing).

    Returns:
        The folder as a `Path`.

    Raises:
        UsageError: `folder` is not a path.
        OutputError: it exists and is not a folder, or a parent on the way
            to it is a file.
    """
    if not isinstance(folder, str | Path) or not str(folder):
        raise UsageError(f"{argument('folder', folder)}: give the path of a folder")
    folder = Path(folder)
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                raise OutputError(
                    f"{argument('folder', folder)}: {path} is a file, not a folder; "
                    "give a folder for the tokenizer files"
                )
            break
    return folder


def export_tokenizer(
    tokenizer_or_preprocessor, folder, *, check: bool = True, corpus=STRESS_CORPUS
) -> TokenizerFiles:
    """Write a keras-hub tokenizer as Hugging Face tokenizer files, proved token-identical.

    Args:
        tokenizer_or_preprocessor: a keras-hub tokenizer (byte-level BPE,
            SentencePiece or WordPiece, any model subclass that keeps its
            family's tokenization), or a preprocessor, whose tokenizer is
            written with its framing (start/end tokens, truncation, padding).
        folder: the folder to place `tokenizer.json`, `tokenizer_config.json`
            and `special_tokens_map.json` in (created if missing; other files
            in it are left as they are).
        check: prove the files on `corpus` before placing them (the default);
            False writes them unchecked (`identity` is then None).
        corpus: the texts of the proof (the stress corpus by default).

    Returns:
        What was placed, with its `identity` report.

    Raises:
        UsageError: the tokenizer cannot be written (another class, its own
            tokenization, no vocabulary) or the preprocessor's framing cannot.
        OutputError: `folder` cannot hold the files.
        ValidationFailed: a reader differs from keras-hub where no known gap
            explains it, or a reader cannot read the files; nothing is placed.
            The message names the reader, the first differing text and both
            results; `error.report` holds the whole identity report.

    Example:

    >>> import keras_hub, tempfile
    >>> vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "qu", "##ick", "fox"]
    >>> tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary)
    >>> folder = tempfile.mkdtemp()
    >>> files = export_tokenizer(tokenizer, folder)
    >>> files.identity.passed, [path.name for path in files.files]
    (True, ['tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json'])
    """
    folder = check_folder(folder)
    with tempfile.TemporaryDirectory(prefix="keras-layers-tokenizer-") as name:
        staging = Path(name)
        written = write_tokenizer(tokenizer_or_preprocessor, staging)
        identity = None
        if check:
            identity = check_identity(tokenizer_or_preprocessor, staging, corpus)
            if not identity.passed:
                raise ValidationFailed(
                    f"the tokenizer files are not token-identical to keras-hub's "
                    f"{written.keras_class}: {identity.failure()}. Nothing was placed.",
                    {"tokenizer": replace(written, identity=identity).report()},
                )
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OutputError(
                f"{argument('folder', folder)}: cannot create it ({error.strerror or error})"
            ) from error
        moves = [(path, folder / path.name) for path in written.files]
        with placement.output_lock(folder / "tokenizer.json"):
            placement.place(moves)
    placed = tuple(final for _, final in moves)
    if identity is not None:
        identity = replace(identity, folder=folder)
    return replace(written, folder=folder, files=placed, identity=identity)
