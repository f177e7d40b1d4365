"""What a family's converter hands the writer: one plain record, no files.

A converter (`byte_pair`, `sentence_piece`, `word_piece`) reads a keras-hub
tokenizer and returns a `Converted`: the `tokenizer.json` document as a dict,
the class name the readers dispatch on, the special tokens by role, and what
the converter knows the readers will do differently (`known_gaps`). The writer
(`exporting`) adds the preprocessor's framing and writes the files; nothing
here touches the disk.
"""

from dataclasses import dataclass, field

# Gaps every onnxruntime-extensions BPE reader shares.
NUL_GAP = "onnxruntime-extensions reads text as a C string: a U+0000 ends it (encode and decode)"
EMPTY_DECODE_GAP = (
    "onnxruntime-extensions' BPE decoder returns '\ufffd' for ids whose text is empty (only "
    "special tokens)"
)


@dataclass(frozen=True)
class Converted:
    """A keras-hub tokenizer in the Hugging Face `tokenizers` format.

    Attributes:
        family: the tokenizer family in words ("byte-level BPE",
            "SentencePiece unigram", ...).
        document: the `tokenizer.json` document, without framing
            (`post_processor`, `truncation` and `padding` are None).
        tokenizer_class: the `tokenizer_config.json` class name, which
            onnxruntime-extensions and transformers dispatch on.
        special_tokens: role (`"bos_token"`, `"unk_token"`, ...) -> token text.
        start_end: the tokens the tokenizer itself adds around every text
            (a `SentencePieceTokenizer` built with `add_bos`/`add_eos`), as
            (start or None, end or None).
        known_gaps: reader -> why it cannot read these files exactly (a
            reader with no entry is expected to be identical).
        config: family-specific `tokenizer_config.json` entries
            (`do_lower_case` for WordPiece).
        decode_skips_special: whether keras-hub's `detokenize` drops special
            tokens (SentencePiece drops control pieces; keras-hub's BPE and
            WordPiece keep them), so a reader decodes with
            `skip_special_tokens` set to match.
    """

    family: str
    document: dict
    tokenizer_class: str
    special_tokens: dict = field(default_factory=dict)
    start_end: tuple = (None, None)
    known_gaps: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    decode_skips_special: bool = False


def added_token(
    content: str, token_id: int, special: bool = True, normalized: bool = False
) -> dict:
    """One entry of `tokenizer.json`'s `added_tokens`.

    Args:
        content: the token's text.
        token_id: its id in the vocabulary.
        special: whether decoders skip it with `skip_special_tokens`.
        normalized: whether it is matched in the normalized text (True) or in
            the raw text (False).

    Returns:
        The entry as `tokenizers` serializes it.
    """
    return {
        "id": int(token_id),
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": normalized,
        "special": special,
    }


def document(model: dict, normalizer=None, pre_tokenizer=None, decoder=None, added=()) -> dict:
    """A `tokenizer.json` document without framing.

    Args:
        model: the `model` entry (BPE, Unigram or WordPiece).
        normalizer: the `normalizer` entry, or None.
        pre_tokenizer: the `pre_tokenizer` entry, or None.
        decoder: the `decoder` entry, or None.
        added: the `added_tokens` entries, sorted by id here.

    Returns:
        The document, keys in the order `tokenizers` writes them.
    """
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": sorted(added, key=lambda entry: entry["id"]),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "model": model,
        "post_processor": None,
        "decoder": decoder,
    }
