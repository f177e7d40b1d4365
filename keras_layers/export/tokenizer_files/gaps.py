"""Which differences a known gap explains: the rule the export's identity gate applies.

A converter lists, per reader, the gaps it expects (`Converted.known_gaps`:
the texts defined beside each converter). A gap is a claim about *which*
texts a reader reads otherwise, so each gap text is paired here with a test
of one `Difference`: a U+0000 in the text, a literal control piece such as
`<s>` in it, a word longer than keras-hub's limit, and so on. A difference
that no listed gap explains is unexplained, and fails the export.

Some gaps say the reader is another algorithm altogether: onnxruntime-
extensions reads no WordPiece `tokenizer.json` (its `BertTokenizer` operator
splits otherwise), and its SentencePiece-BPE reader applies no normalizer and
has no unknown piece. Such a reader is measured and reported, never a reason
to fail (`measured_only`).
"""

import unicodedata
from dataclasses import dataclass, field

from keras_layers.export.tokenizer_files import (
    byte_pair,
    converted,
    framing,
    sentence_piece,
    word_piece,
)


@dataclass
class _Tokenizer:
    """The keras-hub tokenizer a difference came from, its pieces read once."""

    tokenizer: object
    _pieces: list | None = field(default=None, repr=False)

    @property
    def pieces(self) -> list:
        if self._pieces is None:
            self._pieces = list(sentence_piece.model_proto(self.tokenizer).pieces)
        return self._pieces

    def ids(self, text: str) -> list:
        return [int(i) for i in self.tokenizer.tokenize(text)]


def _ids_of(value):
    return value[0] if isinstance(value, tuple) else value


def _literal_piece(difference, tokenizer: _Tokenizer) -> bool:
    """The text holds a control, unknown or byte piece's literal text ('<s>', '<0x41>')."""
    kept = (sentence_piece.NORMAL, sentence_piece.USER_DEFINED)
    literal = [p.piece for p in tokenizer.pieces if p.type not in kept]
    return any(piece in difference.text for piece in literal)


def _user_defined(difference, tokenizer: _Tokenizer) -> bool:
    found = [p.piece for p in tokenizer.pieces if p.type == sentence_piece.USER_DEFINED]
    return any(piece in difference.text for piece in found)


def _marks(difference, tokenizer: _Tokenizer) -> bool:
    """Combining marks or conjoining jamo (`Precompiled` normalizes per grapheme)."""
    return any(unicodedata.combining(c) or "\u1100" <= c <= "\u11ff" for c in difference.text)


def _tie(difference, tokenizer: _Tokenizer) -> bool:
    """The same pieces in another order: equal scores, a tie broken otherwise."""
    keras, reader = _ids_of(difference.keras), _ids_of(difference.reader)
    return isinstance(reader, list) and sorted(keras) == sorted(reader)


def _byte_pieces(difference, tokenizer: _Tokenizer) -> bool:
    pieces = tokenizer.pieces
    return any(pieces[i].type == sentence_piece.BYTE for i in tokenizer.ids(difference.text))


def _hex_lookalike(difference, tokenizer: _Tokenizer) -> bool:
    pieces = tokenizer.pieces
    for i in tokenizer.ids(difference.text):
        raw = pieces[i].piece.encode("utf-8")
        if len(raw) == 6 and all(chr(b) in "0123456789ABCDEF" for b in raw[3:5]):
            return True
    return False


def _no_end_token(difference, tokenizer: _Tokenizer) -> bool:
    """The reader left out keras-hub's last id, a control piece (`</s>`)."""
    keras, reader = _ids_of(difference.keras), _ids_of(difference.reader)
    if not (isinstance(reader, list) and keras and reader == keras[:-1]):
        return False
    return tokenizer.pieces[keras[-1]].type == sentence_piece.CONTROL


def _start_for_end(difference, tokenizer: _Tokenizer) -> bool:
    """Framed: the reader put the start token first where keras-hub put the end token last."""
    keras, reader = _ids_of(difference.keras), _ids_of(difference.reader)
    start = getattr(tokenizer.tokenizer, "start_token_id", None)
    end = getattr(tokenizer.tokenizer, "end_token_id", None)
    if difference.check != "framed" or not keras or start is None or keras[-1] != end:
        return False
    return reader == [start, *keras[:-1]]


def _long_run(difference, tokenizer: _Tokenizer) -> bool:
    return any(len(word) > 100 for word in difference.text.split())


def _long_word(difference, tokenizer: _Tokenizer) -> bool:
    return any(len(word.encode("utf-8")) > 100 for word in difference.text.split())


def _literal_pad(difference, tokenizer: _Tokenizer) -> bool:
    """Same ids; the masks differ only where keras-hub masked a pad id inside the text."""
    if difference.check != "framed" or not isinstance(difference.reader, tuple):
        return False
    (ids, mask), (got_ids, got_mask) = difference.keras, difference.reader
    pad = getattr(tokenizer.tokenizer, "pad_token_id", None)
    if got_ids != ids or got_mask is None or len(got_mask) != len(mask):
        return False
    return all(
        ours == theirs or (ours, theirs, i) == (0, 1, pad)
        for ours, theirs, i in zip(mask, got_mask, ids, strict=True)
    )


_HEX_LOOKALIKE_GAP = "onnxruntime-extensions reads any 6-byte piece"
_SPM = sentence_piece
# Gap text (or, for a gap that names its pieces, its opening) -> test of one difference.
_TESTS = {
    converted.NUL_GAP: lambda d, t: "\x00" in d.text,
    converted.EMPTY_DECODE_GAP: lambda d, t: (
        d.check == "decode" and (d.keras, d.reader) == ("", "\ufffd")
    ),
    byte_pair.PREFIX_SPACE_GAP: lambda d, t: not d.text.startswith(" "),
    _SPM.CONTROL_TEXT_GAP: _literal_piece,
    _SPM.UNIGRAM_TEXT_GAP: _literal_piece,
    _SPM.TIE_GAP: _tie,
    _SPM.PRECOMPILED_GAP: _marks,
    _SPM.USER_DEFINED_GAPS[0]: _user_defined,
    _SPM.USER_DEFINED_GAPS[1]: _user_defined,
    _SPM.UNIGRAM_READER_GAPS[0]: lambda d, t: d.check == "decode" and "\u2047" in d.keras,
    _SPM.UNIGRAM_READER_GAPS[1]: lambda d, t: d.text != d.text.strip() or "  " in d.text,
    _SPM.UNIGRAM_READER_GAPS[2]: lambda d, t: d.text == "" and _ids_of(d.reader) == [],
    _SPM.BYTE_FALLBACK_GAP: _byte_pieces,
    _HEX_LOOKALIKE_GAP: _hex_lookalike,
    _SPM.BPE_READER_GAPS["prefix"]: lambda d, t: d.check == "decode" and d.reader == " " + d.keras,
    _SPM.BPE_READER_GAPS["chunks"]: _long_run,
    _SPM.BPE_READER_GAPS["eos"]: lambda d, t: _no_end_token(d, t) or _start_for_end(d, t),
    word_piece.WORD_LIMIT_GAP: _long_word,
    word_piece.PLACEHOLDER_GAP: lambda d, t: any(ord(c) >= 0x10F000 for c in d.text),
    framing.LITERAL_PAD_GAP: _literal_pad,
}


_OTHER_ALGORITHM = (
    word_piece.BERT_OP_GAP,
    _SPM.BPE_READER_GAPS["normalizer"],
    _SPM.BPE_READER_GAPS["unknown"],
)


def measured_only(gaps) -> bool:
    """Whether a reader's gaps say it is another algorithm, measured but never failed.

    Args:
        gaps: the reader's known gaps.

    Returns:
        True for onnxruntime-extensions' `BertTokenizer` operator, and for its
        SentencePiece-BPE reader where the files need a normalizer or an
        unknown piece.
    """
    return any(gap in gaps for gap in _OTHER_ALGORITHM)


def gap_test(gap: str):
    """The test of one difference for a listed gap.

    Args:
        gap: a gap text from `Converted.known_gaps`.

    Returns:
        A function of (difference, tokenizer) that says whether the gap explains it.

    Raises:
        KeyError: the gap has no test (a converter's new gap needs one here).
    """
    for text, test in _TESTS.items():
        if gap == text or gap.startswith(text):
            return test
    raise KeyError(f"no test for the known gap {gap!r}")


def unexplained(differences, gaps, tokenizer) -> tuple:
    """The differences that none of the known gaps explains.

    Args:
        differences: one reader's `Difference`s.
        gaps: that reader's known gaps.
        tokenizer: the keras-hub tokenizer the files were written from.

    Returns:
        The unexplained differences, in their order (none for a reader that
        is only measured: its differences are reported, not judged).
    """
    if measured_only(gaps):
        return ()
    tests = [gap_test(gap) for gap in gaps]
    context = _Tokenizer(tokenizer)
    return tuple(d for d in differences if not any(test(d, context) for test in tests))
