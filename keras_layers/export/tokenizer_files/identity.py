"""Token identity, proved: keras-hub against every reader of the written files.

`check_identity` encodes each text of a corpus (the stress corpus by default)
with keras-hub, eagerly, as `tokenizer(texts)` does, and decodes those ids with
`tokenizer.detokenize`; then it asks each reader of the folder
(readers.py) for the same. Three checks per text:

- `encode`: the ids without special tokens (with them, when the tokenizer
  itself adds `<s>`/`</s>`, which its file's post-processor then carries);
- `decode`: the text of keras-hub's ids;
- `framed`: for a preprocessor, its `token_ids` and `padding_mask` against the
  file's post-processor, truncation and padding. A reader that neither
  truncates nor pads (onnxruntime-extensions) is held to the unpadded ids of
  the texts keras-hub did not truncate.

Every difference is kept with both sides, in corpus order; the report's
`first` is the first one. Nothing is skipped silently: what a reader cannot
be asked (onnxruntime-extensions' BERT operator does not decode) is listed
in `not_checked`, and the gaps the converter expected are listed beside the
measurements, so a report says both what differs and whether it was known.
Each difference is then judged (gaps.py): one that no known gap explains is
`unexplained`, and a report with any, or with a reader that did not load,
has not `passed`; the export fails on it.
"""

from dataclasses import dataclass, field
from pathlib import Path

from keras_layers.export.errors import UsageError
from keras_layers.export.tokenizer_files import gaps
from keras_layers.export.tokenizer_files.corpus import STRESS_CORPUS
from keras_layers.export.tokenizer_files.exporting import convert, resolve
from keras_layers.export.tokenizer_files.framing import ENCODER_SOURCE, known_gaps, read_framing
from keras_layers.export.tokenizer_files.readers import ReaderUnavailable, readers_for


@dataclass(frozen=True)
class Difference:
    """One text a reader handles otherwise than keras-hub.

    Attributes:
        check: "encode", "decode" or "framed".
        text: the corpus text.
        keras: keras-hub's result (ids, text, or (ids, mask)).
        reader: the reader's result, or the error it raised.
    """

    check: str
    text: str
    keras: object
    reader: object

    def describe(self) -> str:
        """The difference on one line.

        Returns:
            `check of 'text': keras-hub ... / reader ...`.
        """
        return f"{self.check} of {self.text!r}: keras-hub {self.keras!r} / reader {self.reader!r}"


@dataclass(frozen=True)
class ReaderIdentity:
    """How one reader of the files compares with keras-hub.

    Attributes:
        reader: the reader's name ("tokenizers", "onnxruntime-extensions").
        compared: how many (text, check) pairs were compared.
        differences: every difference, in corpus order.
        not_checked: what this reader was not asked, and why.
        known_gaps: what the converter expected this reader to read differently.
        error: why the reader could not be loaded, or None.
        unexplained: the differences no known gap explains (gaps.py).
        measured_only: whether the reader is another algorithm, reported but
            not judged (onnxruntime-extensions' BERT operator).
    """

    reader: str
    compared: int = 0
    differences: tuple = ()
    not_checked: tuple = ()
    known_gaps: tuple = ()
    error: str | None = None
    unexplained: tuple = ()
    measured_only: bool = False

    @property
    def identical(self) -> bool:
        """Whether the reader loaded and matched keras-hub on every comparison."""
        return self.error is None and not self.differences

    @property
    def passed(self) -> bool:
        """Whether the reader loaded and every difference is a known gap (a
        reader that is only measured passes whatever it reads, or if it
        cannot load)."""
        return self.measured_only or (self.error is None and not self.unexplained)

    @property
    def first(self) -> Difference | None:
        """The first difference, or None."""
        return self.differences[0] if self.differences else None

    def summary(self) -> str:
        """The reader's result on one line.

        Returns:
            "identical on N comparisons", or the count and the first difference.
        """
        if self.error is not None:
            return f"{self.reader}: not loaded: {self.error}"
        if not self.differences:
            return f"{self.reader}: identical on {self.compared} comparisons"
        if self.unexplained:
            return (
                f"{self.reader}: {len(self.unexplained)} of {self.compared} comparisons differ "
                f"where no known gap explains it; first: {self.unexplained[0].describe()}"
            )
        judged = "measured, another algorithm" if self.measured_only else "all known gaps"
        return (
            f"{self.reader}: {len(self.differences)} of {self.compared} comparisons differ "
            f"({judged}); first: {self.first.describe()}"
        )


@dataclass(frozen=True)
class IdentityReport:
    """`check_identity`'s result: one `ReaderIdentity` per reader.

    Attributes:
        folder: the folder checked.
        family: the tokenizer family.
        texts: how many corpus texts were encoded.
        readers: the readers' results.
    """

    folder: Path
    family: str
    texts: int
    readers: tuple = field(default_factory=tuple)

    @property
    def identical(self) -> bool:
        """Whether every reader matched keras-hub everywhere."""
        return all(reader.identical for reader in self.readers)

    @property
    def passed(self) -> bool:
        """Whether every reader loaded and differs only where a known gap says."""
        return all(reader.passed for reader in self.readers)

    def failure(self) -> str:
        """Why the report has not passed, on one line ("" when it has).

        Returns:
            The first reader that failed: why it did not load, or its first
            unexplained difference (the text and both results).
        """
        for result in self.readers:
            if result.passed:
                continue
            if result.error is not None:
                return f"{result.reader} could not read the files: {result.error}"
            if result.unexplained:
                return (
                    f"{result.reader} tokenizes {len(result.unexplained)} of {result.compared} "
                    f"comparisons otherwise than keras-hub; first: "
                    f"{result.unexplained[0].describe()}"
                )
        return ""

    def reader(self, name: str) -> ReaderIdentity:
        """One reader's result.

        Args:
            name: "tokenizers" or "onnxruntime-extensions".

        Returns:
            Its `ReaderIdentity`.

        Raises:
            KeyError: no reader of that name was run.
        """
        for result in self.readers:
            if result.reader == name:
                return result
        raise KeyError(name)

    def report(self) -> dict:
        """The report as plain data (for JSON reports and the command line).

        Returns:
            A dict of strings, numbers, lists and None.
        """
        readers = [
            {
                "reader": result.reader,
                "identical": result.identical,
                "compared": result.compared,
                "differences": [vars(difference) for difference in result.differences],
                "not_checked": list(result.not_checked),
                "known_gaps": list(result.known_gaps),
                "error": result.error,
                "unexplained": [vars(difference) for difference in result.unexplained],
                "measured_only": result.measured_only,
                "passed": result.passed,
            }
            for result in self.readers
        ]
        return {
            "folder": str(self.folder),
            "family": self.family,
            "texts": self.texts,
            "identical": self.identical,
            "passed": self.passed,
            "readers": readers,
        }

    def summary(self) -> str:
        """The report, one line per reader.

        Returns:
            The lines, joined.
        """
        lines = [f"{self.family} tokenizer files in {self.folder}, {self.texts} texts:"]
        return "\n".join(lines + ["  " + reader.summary() for reader in self.readers])


def _keras_encode(tokenizer, texts: list) -> list:
    output = tokenizer(list(texts))
    if hasattr(output, "to_list"):
        output = output.to_list()
    return [[int(i) for i in row] for row in output]


def _keras_decode(tokenizer, ids: list) -> str:
    text = tokenizer.detokenize(ids)
    if hasattr(text, "numpy"):
        text = text.numpy()
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)


def _keras_framed(preprocessor, framing, texts: list) -> list:
    """keras-hub's framed (ids, mask) rows, as the preprocessor makes them.

    A causal LM frames with `generate_preprocess`, as does an encoder-decoder
    its encoder's input (its decoder's start tokens are not the tokenizer
    file's); a masked LM masks tokens at
    random when called, so its packer is called on the tokenizer's ids (what
    its call packs before masking); any other is called. A preprocessor whose
    output has no `padding_mask` (FNet) gets keras-hub's rule: ids != pad id.
    """
    import keras
    from keras_hub.models import MaskedLMPreprocessor

    name = type(preprocessor).__name__
    try:
        if framing.source.endswith((".generate_preprocess", ENCODER_SOURCE)):
            output = preprocessor.generate_preprocess(list(texts))
            if framing.source.endswith(ENCODER_SOURCE):  # an encoder-decoder's encoder input
                output = {
                    "token_ids": output["encoder_token_ids"],
                    "padding_mask": output["encoder_padding_mask"],
                }
        elif isinstance(preprocessor, MaskedLMPreprocessor):
            packed = preprocessor.packer(preprocessor.tokenizer(list(texts)))
            output = {"token_ids": packed[0] if isinstance(packed, tuple) else packed}
        else:
            output = preprocessor(list(texts))
    except Exception as error:  # keras-hub's own failure: it frames no text alone
        raise UsageError(
            f"{name} cannot frame a batch of texts alone ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}): export its `.tokenizer` instead"
        ) from error
    if not isinstance(output, dict) or "token_ids" not in output:
        raise UsageError(
            f"{name} returns no `token_ids` for a batch of texts: export its `.tokenizer` instead"
        )
    ids = keras.ops.convert_to_numpy(output["token_ids"])
    if "padding_mask" in output:
        mask = keras.ops.convert_to_numpy(output["padding_mask"]).astype(int)
    else:
        mask = (ids != preprocessor.tokenizer.token_to_id(framing.pad_token)).astype(int)
    return [(row.tolist(), mask_row.tolist()) for row, mask_row in zip(ids, mask, strict=True)]


def _ask(call, *args):
    """A reader's answer, or the error it raised as text (a difference too)."""
    try:
        return call(*args)
    except Exception as error:  # a reader's failure on one text is a result
        return f"error: {type(error).__name__}: {error}"


@dataclass
class _Keras:
    """keras-hub's answers for the corpus, computed once for all readers."""

    texts: list
    ids: list
    decoded: list
    framed: list | None
    framing: object
    self_framed: bool


def _keras_answers(tokenizer, preprocessor, converted, texts: list) -> _Keras:
    ids = _keras_encode(tokenizer, texts)
    framing = read_framing(preprocessor, tokenizer)
    return _Keras(
        texts=texts,
        ids=ids,
        decoded=[_keras_decode(tokenizer, row) for row in ids],
        framed=None if framing is None else _keras_framed(preprocessor, framing, texts),
        framing=framing,
        self_framed=any(converted.start_end),
    )


def _encode_differences(reader, keras: _Keras) -> list:
    found = []
    for text, ids in zip(keras.texts, keras.ids, strict=True):
        if keras.self_framed:
            got = _ask(lambda t: reader.encode_framed(t)[0], text)
        else:
            got = _ask(reader.encode, text)
        if got != ids:
            found.append(Difference("encode", text, ids, got))
    return found


def _decode_differences(reader, keras: _Keras) -> list | None:
    found = []
    for text, ids, decoded in zip(keras.texts, keras.ids, keras.decoded, strict=True):
        got = _ask(reader.decode, ids)
        if got is None:
            return None
        if got != decoded:
            found.append(Difference("decode", text, decoded, got))
    return found


def _framed_differences(reader, keras: _Keras) -> tuple:
    """(differences, texts left out because keras-hub truncated them)."""
    found, truncated = [], 0
    framing = keras.framing
    added = len(framing.start) + len(framing.end)
    for text, raw, (ids, mask) in zip(keras.texts, keras.ids, keras.framed, strict=True):
        got = _ask(reader.encode_framed, text)
        if isinstance(got, str):
            found.append(Difference("framed", text, ids, got))
            continue
        got_ids, got_mask = got
        if got_mask is not None:
            if (got_ids, got_mask) != (ids, mask):
                found.append(Difference("framed", text, (ids, mask), (got_ids, got_mask)))
            continue
        if framing.sequence_length and len(raw) + added > framing.sequence_length:
            truncated += 1
            continue
        # Padding cut off by length: a pad token written in the text stays.
        length = len(raw) + added
        unpadded = ids[:length] if framing.padding_side == "right" else ids[len(ids) - length :]
        if got_ids != unpadded:
            found.append(Difference("framed", text, unpadded, got_ids))
    return found, truncated


def _check_reader(
    reader_class, folder: Path, converted, keras: _Keras, tokenizer
) -> ReaderIdentity:
    known = known_gaps(converted.known_gaps, keras.framing).get(reader_class.name, ())
    measured = gaps.measured_only(known)
    try:
        reader = reader_class(folder, converted.decode_skips_special)
    except ReaderUnavailable as error:
        return ReaderIdentity(
            reader_class.name, known_gaps=known, error=str(error), measured_only=measured
        )
    differences = _encode_differences(reader, keras)
    compared, not_checked = len(keras.texts), []
    decoded = _decode_differences(reader, keras)
    if decoded is None:
        not_checked.append("decode: this reader reads no decoder from the files")
    else:
        differences += decoded
        compared += len(keras.texts)
    if keras.framed is not None:
        framed, truncated = _framed_differences(reader, keras)
        differences += framed
        compared += len(keras.texts) - truncated
        if truncated:
            not_checked.append(
                f"framed: {truncated} texts keras-hub truncates (this reader does not truncate)"
            )
    return ReaderIdentity(
        reader_class.name,
        compared=compared,
        differences=tuple(differences),
        not_checked=tuple(not_checked),
        known_gaps=known,
        unexplained=gaps.unexplained(differences, known, tokenizer),
        measured_only=measured,
    )


def check_identity(tokenizer_or_preprocessor, folder, corpus=STRESS_CORPUS) -> IdentityReport:
    """Whether the files in `folder` tokenize `corpus` as keras-hub does, reader by reader.

    Args:
        tokenizer_or_preprocessor: what `export_tokenizer` was given.
        folder: the folder `export_tokenizer` wrote.
        corpus: the texts to compare on (the stress corpus by default).

    Returns:
        The report: every difference of every reader, with both sides.

    Raises:
        UsageError: the tokenizer or preprocessor cannot be written at all
            (the same refusals as `export_tokenizer`).
    """
    tokenizer, preprocessor = resolve(tokenizer_or_preprocessor)
    converted = convert(tokenizer)
    keras = _keras_answers(tokenizer, preprocessor, converted, list(corpus))
    folder = Path(folder)
    results = tuple(
        _check_reader(reader, folder, converted, keras, tokenizer)
        for reader in readers_for(converted.family)
    )
    return IdentityReport(
        folder=folder, family=converted.family, texts=len(keras.texts), readers=results
    )
