"""SentencePiece (`SentencePieceTokenizer` and its model subclasses) as `tokenizer.json`.

keras-hub encodes with the `sentencepiece` library itself, so the reference is
the serialized `ModelProto` the tokenizer holds. It is read field by field:

- the normalizer spec becomes a `normalizers.Sequence`: the precompiled
  charsmap (`Precompiled`), then SentencePiece's whitespace rules written as
  regex replacements (runs of spaces folded, leading and trailing ones
  dropped when `remove_extra_whitespaces`), the dummy prefix and the escaping
  of spaces to U+2581. The whole text is normalized before the added tokens
  are matched (they are `normalized: true`), as SentencePiece prepends the
  dummy prefix once per text, not once per segment;
- a unigram model keeps its pieces and scores (`models.Unigram`);
- a BPE model has no merge list: SentencePiece merges the adjacent pair whose
  concatenation is the best-scoring piece. The merges are derived from the
  pieces: every split of a normal piece into two normal pieces is a merge,
  ranked by the merged piece's score (then by the two halves' ids, for a
  stable order). Control, unknown, byte, user-defined and unused pieces are
  never merged, as in SentencePiece;
- byte fallback maps to `byte_fallback` and the `ByteFallback` decoder;
- control pieces (`<s>`, `</s>`, ...) are special added tokens (readers find
  `bos_token` and skip them on decoding, as SentencePiece drops them),
  user-defined pieces plain added tokens; the unknown piece stays the
  model's, decoded to SentencePiece's surface (" \u2047 ").

`tokenizer_class` picks onnxruntime-extensions' implementation (see
`_reader_class`). What the format or a reader cannot match is listed in
`known_gaps` and measured by `check_identity`: every reader matches a control
token's literal text, `Precompiled` applies the charsmap per grapheme, equal
unigram scores tie-break otherwise, and onnxruntime-extensions' readers have
their own simplifications, each named below.
"""

import base64

from keras_layers.export.errors import UsageError
from keras_layers.export.tokenizer_files.converted import (
    EMPTY_DECODE_GAP,
    NUL_GAP,
    Converted,
    added_token,
    document,
)

SPACE = "\u2581"
# sentencepiece_model.proto's enums, by value (the proto is read without
# importing its generated module at the top: it needs protobuf).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE = 1, 2

PRECOMPILED_GAP = (
    "`Precompiled` applies the charsmap per grapheme (whole graphemes under 6 bytes, else "
    "per character); SentencePiece applies it to the longest matching prefix, so a letter "
    "followed by several combining marks can normalize differently"
)
CONTROL_TEXT_GAP = (
    "the literal text of a control token ('<s>') is that token for this reader; SentencePiece "
    "treats it as plain text"
)
UNIGRAM_TEXT_GAP = (
    "the unigram lattice of `tokenizers` matches every piece, so the literal text of the unknown "
    "piece ('<unk>') and of byte pieces ('<0x41>') is that piece too; SentencePiece never "
    "matches them in text"
)
TIE_GAP = (
    "where two segmentations score exactly the same (the same pieces in another order, as in "
    "a long run of one character), the reader's Viterbi search breaks the tie otherwise than "
    "SentencePiece's"
)
UNIGRAM_READER_GAPS = (
    "onnxruntime-extensions' unigram reader decodes the unknown piece as its text ('<unk>'); "
    "SentencePiece writes ' \u2047 '",
    "onnxruntime-extensions' unigram reader always prepends the dummy prefix and folds "
    "whitespace, whatever the normalizer spec says",
    "onnxruntime-extensions' unigram reader returns no id for an empty text, not even the "
    "framing's end token (T5's `</s>`)",
)
BYTE_FALLBACK_GAP = (
    "onnxruntime-extensions' unigram reader applies byte fallback only for MarianTokenizer: "
    "characters outside the vocabulary become the unknown piece"
)
USER_DEFINED_GAPS = (
    "a text that starts with a user-defined piece gets no dummy prefix before it (the prefix "
    "would also be added to the piece's own text, which tokenizers normalizes to find it)",
    "onnxruntime-extensions prepends the dummy prefix to each stretch of text between added "
    "tokens, not once per text",
)
BPE_READER_GAPS = {
    "normalizer": "onnxruntime-extensions' SentencePiece-BPE reader applies no normalizer "
    "(no charsmap, no whitespace folding)",
    "unknown": "onnxruntime-extensions' SentencePiece-BPE reader has no unknown piece: without "
    "byte fallback, a character outside the vocabulary becomes id 4294967295",
    "prefix": "onnxruntime-extensions strips the dummy prefix when decoding only after a special "
    "token (it expects <s> first): other ids decode with a leading space",
    "chunks": "onnxruntime-extensions merges a run of more than 100 characters without a space "
    "in separate chunks",
    "eos": "onnxruntime-extensions' SentencePiece-BPE reader adds <s> when asked for special "
    "tokens but never </s> (it ignores add_eos_token and add_bos_token: T5's framing, the text "
    "then </s>, comes out as its start token, T5's alias of </s>, then the text)",
}


def _hex_lookalikes(proto) -> list:
    """Pieces onnxruntime-extensions' unigram reader mistakes for byte pieces.

    Its check for `<0xXY>` compares only the length (6 bytes) and the 4th and
    5th bytes (hex digits), so '\u2581123' reads as the byte 0x12.
    """
    found = []
    for piece in proto.pieces:
        raw = piece.piece.encode("utf-8")
        if (
            piece.type != BYTE
            and len(raw) == 6
            and all(chr(b) in "0123456789ABCDEF" for b in raw[3:5])
        ):
            found.append(piece.piece)
    return found


def _known_gaps(proto) -> dict:
    spec, trainer = proto.normalizer_spec, proto.trainer_spec
    unigram = trainer.model_type == UNIGRAM
    symbols = spec.add_dummy_prefix and any(p.type == USER_DEFINED for p in proto.pieces)
    library = [CONTROL_TEXT_GAP] + ([UNIGRAM_TEXT_GAP, TIE_GAP] if unigram else [])
    library += [PRECOMPILED_GAP] if spec.precompiled_charsmap else []
    library += [USER_DEFINED_GAPS[0]] if symbols else []
    extensions = [CONTROL_TEXT_GAP, NUL_GAP] + (
        [USER_DEFINED_GAPS[1]] if symbols and not unigram else []
    )
    if unigram:
        extensions += [TIE_GAP, *UNIGRAM_READER_GAPS]
        extensions += [BYTE_FALLBACK_GAP] if trainer.byte_fallback else []
        lookalikes = _hex_lookalikes(proto)
        if lookalikes:
            extensions.append(
                "onnxruntime-extensions reads any 6-byte piece whose 4th and 5th bytes are hex "
                f"digits as a byte piece <0xXY>: {', '.join(map(repr, lookalikes))}"
            )
    else:
        extensions += [BPE_READER_GAPS["chunks"], BPE_READER_GAPS["eos"], EMPTY_DECODE_GAP]
        if spec.precompiled_charsmap or spec.remove_extra_whitespaces:
            extensions.append(BPE_READER_GAPS["normalizer"])
        if not trainer.byte_fallback:
            extensions.append(BPE_READER_GAPS["unknown"])
        if spec.add_dummy_prefix:
            extensions.append(BPE_READER_GAPS["prefix"])
    return {"tokenizers": library, "onnxruntime-extensions": extensions}


def model_proto(tokenizer):
    """The tokenizer's SentencePiece `ModelProto`, parsed.

    Args:
        tokenizer: a keras-hub `SentencePieceTokenizer`.

    Returns:
        The parsed `sentencepiece_model_pb2.ModelProto`.

    Raises:
        UsageError: the tokenizer has no proto (no vocabulary was loaded).
    """
    from sentencepiece import sentencepiece_model_pb2

    if getattr(tokenizer, "proto", None) is None:
        raise UsageError(
            f"{type(tokenizer).__name__} has no SentencePiece model loaded (its `proto` is "
            "None): build it with `proto=...` or load it with `from_preset` first"
        )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tokenizer.proto)
    return proto


def _refuse_inexpressible(proto, name: str) -> None:
    trainer, spec = proto.trainer_spec, proto.normalizer_spec
    problems = []
    if trainer.model_type not in (UNIGRAM, BPE):
        problems.append(f"model_type {trainer.model_type} (only unigram and BPE are written)")
    if trainer.treat_whitespace_as_suffix:
        problems.append("treat_whitespace_as_suffix (no suffix form in tokenizer.json)")
    if proto.denormalizer_spec.precompiled_charsmap:
        problems.append("a denormalizer charsmap (tokenizer.json decoders cannot apply one)")
    if spec.add_dummy_prefix and not spec.escape_whitespaces:
        problems.append("a dummy prefix without escaped whitespace")
    if problems:
        raise UsageError(
            f"{name}'s SentencePiece model cannot be written as tokenizer.json: "
            + "; ".join(problems)
        )


def _literal(text: str) -> str:
    """`text` as an Oniguruma pattern matching it literally."""
    return "".join(char if char.isalnum() else f"\\x{{{ord(char):X}}}" for char in text)


def _dummy_prefix(user_defined: list) -> dict:
    if not user_defined:
        # `Prepend` leaves an empty text empty, as SentencePiece does.
        return {"type": "Prepend", "prepend": " "}
    # The added tokens are matched in the normalized text, and their own text
    # is normalized to find them: a `Prepend` would make '<u>' '\u2581<u>',
    # which swallows the space before the symbol. The prefix goes before any
    # text that does not start with a user-defined piece instead.
    others = "|".join(_literal(piece) for piece in user_defined)
    return {"type": "Replace", "pattern": {"Regex": rf"\A(?=[\s\S])(?!{others})"}, "content": " "}


def _normalizer(spec, user_defined: list) -> dict | None:
    steps = []
    if spec.precompiled_charsmap:
        charsmap = base64.b64encode(spec.precompiled_charsmap).decode("ascii")
        steps.append({"type": "Precompiled", "precompiled_charsmap": charsmap})
    if spec.remove_extra_whitespaces:
        steps.append({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "})
        steps.append({"type": "Replace", "pattern": {"Regex": r"\A | \z"}, "content": ""})
    if spec.add_dummy_prefix:
        steps.append(_dummy_prefix(user_defined))
    if spec.escape_whitespaces:
        steps.append({"type": "Replace", "pattern": {"String": " "}, "content": SPACE})
    if not steps:
        return None
    return {"type": "Sequence", "normalizers": steps}


def _unigram(proto) -> dict:
    return {
        "type": "Unigram",
        "unk_id": int(proto.trainer_spec.unk_id),
        "vocab": [[piece.piece, float(piece.score)] for piece in proto.pieces],
        "byte_fallback": bool(proto.trainer_spec.byte_fallback),
    }


def derive_merges(pieces) -> list:
    """BPE merges equivalent to SentencePiece's best-scoring-piece rule.

    Args:
        pieces: (text, score, type) per piece, in id order.

    Returns:
        `[left, right]` pairs, best first: every split of a normal piece into
        two normal pieces, ranked by the merged piece's score, then by the
        halves' ids.
    """
    ids = {text: index for index, (text, _, kind) in enumerate(pieces) if kind == NORMAL}
    ranked = []
    for index, (text, score, kind) in enumerate(pieces):
        if kind != NORMAL or len(text) < 2:
            continue
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ids and right in ids:
                ranked.append((-score, index, ids[left], ids[right], left, right))
    ranked.sort()
    return [[left, right] for *_, left, right in ranked]


def _bpe(proto) -> dict:
    pieces = [(piece.piece, piece.score, piece.type) for piece in proto.pieces]
    unk = proto.pieces[proto.trainer_spec.unk_id].piece
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": unk,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": True,
        "byte_fallback": bool(proto.trainer_spec.byte_fallback),
        "ignore_merges": False,
        "vocab": {text: index for index, (text, _, _) in enumerate(pieces)},
        "merges": derive_merges(pieces),
    }


def _added_tokens(proto) -> list:
    added = []
    for index, piece in enumerate(proto.pieces):
        if piece.type == CONTROL:
            added.append(added_token(piece.piece, index, special=True))
        elif piece.type == USER_DEFINED:
            # Matched in the normalized text: SentencePiece normalizes (and
            # prepends the dummy prefix) once for the whole text.
            added.append(added_token(piece.piece, index, special=False, normalized=True))
    return added


def _decoder(proto) -> dict:
    spec, trainer = proto.normalizer_spec, proto.trainer_spec
    # SentencePiece decodes the unknown piece to its surface (" \u2047 "), not
    # to its text: it is no added token, so `skip_special_tokens` keeps it.
    unknown = proto.pieces[trainer.unk_id].piece
    steps = [{"type": "Replace", "pattern": {"String": unknown}, "content": trainer.unk_surface}]
    if spec.escape_whitespaces:
        steps.append({"type": "Replace", "pattern": {"String": SPACE}, "content": " "})
    if trainer.byte_fallback:
        steps.append({"type": "ByteFallback"})
    steps.append({"type": "Fuse"})
    if spec.add_dummy_prefix:
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {"type": "Sequence", "decoders": steps}


def _special_tokens(proto) -> dict:
    trainer = proto.trainer_spec
    roles = {}
    for role, index in (
        ("unk_token", trainer.unk_id),
        ("bos_token", trainer.bos_id),
        ("eos_token", trainer.eos_id),
        ("pad_token", trainer.pad_id),
    ):
        if 0 <= index < len(proto.pieces):
            roles[role] = proto.pieces[index].piece
    return roles


def convert_sentence_piece(tokenizer) -> Converted:
    """A keras-hub `SentencePieceTokenizer` as `tokenizer.json`.

    Args:
        tokenizer: the tokenizer (or a subclass: Llama, Gemma, T5, ALBERT...).

    Returns:
        The conversion, with the gaps each reader is known to have.

    Raises:
        UsageError: no proto is loaded, or the model uses a feature
            `tokenizer.json` cannot express.
    """
    proto = model_proto(tokenizer)
    name = type(tokenizer).__name__
    _refuse_inexpressible(proto, name)
    unigram = proto.trainer_spec.model_type == UNIGRAM
    special = _special_tokens(proto)
    start = special.get("bos_token") if tokenizer.add_bos else None
    end = special.get("eos_token") if tokenizer.add_eos else None
    return Converted(
        family="SentencePiece unigram" if unigram else "SentencePiece BPE",
        document=document(
            _unigram(proto) if unigram else _bpe(proto),
            normalizer=_normalizer(
                proto.normalizer_spec, [p.piece for p in proto.pieces if p.type == USER_DEFINED]
            ),
            decoder=_decoder(proto),
            added=_added_tokens(proto),
        ),
        tokenizer_class=_reader_class(proto, name),
        special_tokens=special,
        start_end=(start, end),
        known_gaps=_known_gaps(proto),
        decode_skips_special=True,
    )


def _reader_class(proto, name: str) -> str:
    # onnxruntime-extensions picks its implementation from the class name:
    # "T5Tokenizer" (or XLM-R, DeBERTa-v2) for unigram models; for BPE models
    # "LlamaTokenizer" pre-splits with a regex (marks apart from letters) where
    # SentencePiece does not, and "GemmaTokenizer" merges the text as it
    # comes, so every SentencePiece BPE is written as Gemma's (it reads the
    # dummy prefix from the decoder's `Strip`). T5's class also makes it append
    # `</s>`, so only T5 itself is written as T5.
    if proto.trainer_spec.model_type == UNIGRAM:
        return "T5Tokenizer" if name == "T5Tokenizer" else "XLMRobertaTokenizer"
    return "GemmaTokenizer"
