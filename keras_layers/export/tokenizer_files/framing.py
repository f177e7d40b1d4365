"""A keras-hub preprocessor's framing, read from its packer and written as `tokenizers` JSON.

A preprocessor wraps the token ids its tokenizer returns: start and end
tokens, a separator between two segments, truncation to `sequence_length`
and padding. keras-hub keeps that in a packer layer (`StartEndPacker` for
causal language models and one-segment classifiers, `MultiSegmentPacker` for
classifiers, masked language models and embedders), built on first use; the packer is read, not the
preprocessor's class, so a subclass that keeps the same packer is covered.

A causal LM preprocessor (one with `generate_preprocess`, whatever its
packer) is written as `generate_preprocess` frames a prompt (the start token,
no end token: generation continues the text), which is what a deployed
decoder receives. The framing becomes a `TemplateProcessing`
post-processor, `truncation` (keras-hub trims the text, never the special
tokens, as `tokenizers` does) and `padding` to `sequence_length`, so that
`Tokenizer.encode(text)` returns the padded `token_ids` and, as its attention
mask, the `padding_mask`.
"""

from dataclasses import dataclass

from keras_layers.export.errors import UsageError

# keras-hub's truncation algorithms -> `tokenizers`' closest strategy.
TRUNCATION = {"round_robin": "LongestFirst", "waterfall": "OnlySecond"}


@dataclass(frozen=True)
class Framing:
    """The special tokens and lengths a preprocessor adds around the token ids.

    Attributes:
        source: where the framing was read ("GPT2CausalLMPreprocessor.generate_preprocess").
        start: tokens before the first segment.
        end: tokens after the last segment.
        separator: tokens between two segments, or None when pairs are not framed.
        sequence_length: the length keras-hub pads and truncates to, or None.
        pad_token: the padding token, or None.
        padding_side: "right" or "left".
        truncate: keras-hub's truncation algorithm for pairs.
    """

    source: str
    start: tuple = ()
    end: tuple = ()
    separator: tuple | None = None
    sequence_length: int | None = None
    pad_token: str | None = None
    padding_side: str = "right"
    truncate: str = "round_robin"

    def adds(self, token: str | None) -> bool:
        """Whether the framing puts `token` around the text.

        Args:
            token: a token's text, or None.

        Returns:
            True when `token` is one of the start, end or separator tokens.
        """
        return token is not None and token in self.start + self.end + (self.separator or ())


LITERAL_PAD_GAP = (
    "keras-hub's padding mask is `token_ids != pad_id`, so a pad token written in the text "
    "itself is masked too; the reader's attention mask marks only the padding"
)


def known_gaps(converted_gaps: dict, framing: "Framing | None") -> dict:
    """The converter's known gaps, with those the framing adds.

    Args:
        converted_gaps: reader -> gaps, from the converter.
        framing: the preprocessor's framing, or None.

    Returns:
        reader -> tuple of gaps (`tokenizers` also gets `LITERAL_PAD_GAP`
        when the framing pads: it is the reader that reports a mask).
    """
    gaps = {reader: tuple(listed) for reader, listed in converted_gaps.items()}
    if framing is not None and framing.pad_token is not None:
        gaps["tokenizers"] = (*gaps.get("tokenizers", ()), LITERAL_PAD_GAP)
    return gaps


def _tokens(tokenizer, values) -> tuple:
    if values is None:
        return ()
    values = [values] if isinstance(values, int | str) else values
    return tuple(
        value if isinstance(value, str) else tokenizer.id_to_token(int(value)) for value in values
    )


def _pad_token(tokenizer, value) -> str | None:
    return None if value is None else _tokens(tokenizer, value)[0]


def read_framing(preprocessor, tokenizer) -> Framing | None:
    """The framing `preprocessor` puts around `tokenizer`'s ids.

    Args:
        preprocessor: a keras-hub preprocessor, or None.
        tokenizer: its tokenizer (to name the packer's ids).

    Returns:
        The framing, or None when there is no preprocessor.

    Raises:
        UsageError: the preprocessor frames with something other than a
            `StartEndPacker` or a `MultiSegmentPacker`.
    """
    from keras.layers import Layer
    from keras_hub.layers import MultiSegmentPacker, StartEndPacker

    if preprocessor is None:
        return None
    if hasattr(preprocessor, "encoder_sequence_length"):  # a Seq2SeqLM's: its encoder's side
        return _encoder_framing(preprocessor, tokenizer)
    name = type(preprocessor).__name__
    # The packer is made in `build` (once the tokenizer's assets are loaded);
    # a class without a `build` of its own has none to make.
    if (
        getattr(preprocessor, "packer", None) is None
        and type(preprocessor).build is not Layer.build
    ):
        preprocessor.build(None)
    packer = getattr(preprocessor, "packer", None)
    generates = hasattr(preprocessor, "generate_preprocess")
    # A causal LM frames a prompt with its start tokens and no end token,
    # whichever packer it holds (Gemma 3's is a MultiSegmentPacker).
    if isinstance(packer, StartEndPacker | MultiSegmentPacker) and generates:
        return Framing(
            source=f"{name}.generate_preprocess",
            start=_tokens(tokenizer, packer.start_value),
            sequence_length=preprocessor.sequence_length,
            pad_token=_pad_token(tokenizer, packer.pad_value),
            padding_side=packer.padding_side,
        )
    if isinstance(packer, StartEndPacker):  # one segment, framed (ESM's classifier)
        return Framing(
            source=name,
            start=_tokens(tokenizer, packer.start_value),
            end=_tokens(tokenizer, packer.end_value),
            sequence_length=packer.sequence_length,
            pad_token=_pad_token(tokenizer, packer.pad_value),
            padding_side=packer.padding_side,
        )
    if isinstance(packer, MultiSegmentPacker):
        return Framing(
            source=name,
            start=_tokens(tokenizer, packer.start_value),
            end=_tokens(tokenizer, packer.end_value),
            separator=_tokens(tokenizer, packer.sep_value),
            sequence_length=packer.sequence_length,
            pad_token=_pad_token(tokenizer, packer.pad_value),
            padding_side=packer.padding_side,
            truncate=packer.truncate,
        )
    held = "no `packer`" if packer is None else f"a {type(packer).__name__} packer"
    raise UsageError(
        f"{name} has {held}; the framing written to tokenizer.json is read from a "
        "StartEndPacker or a MultiSegmentPacker (causal and masked language models, "
        "classifiers, embedders; a sequence-to-sequence model's encoder input): export its "
        "`.tokenizer` instead"
    )


# The end of `Framing.source` for an encoder-decoder's encoder input.
ENCODER_SOURCE = ".generate_preprocess, encoder"


def _encoder_framing(preprocessor, tokenizer) -> Framing:
    """An encoder-decoder's framing of the encoder's input, as its
    `generate_preprocess` frames it: the ids it puts before and after the
    tokenizer's own. Read by running it, not from its `encoder_packer`,
    which each class calls with flags of its own (T5Gemma's adds no end token
    when generating, and a start token only when asked). The decoder's start
    tokens are the seq2seq folder's config, not the tokenizer file's."""
    name = type(preprocessor).__name__
    sample = "a"
    own = [int(i) for i in tokenizer([sample])[0]]
    packed = preprocessor.generate_preprocess([sample])
    ids = [int(i) for i in packed["encoder_token_ids"][0]]
    mask = [bool(m) for m in packed["encoder_padding_mask"][0]]
    framed = [token for token, kept in zip(ids, mask, strict=True) if kept]
    at = next(
        (i for i in range(len(framed) - len(own) + 1) if framed[i : i + len(own)] == own), None
    )
    if not own or at is None:
        raise UsageError(
            f"{name}.generate_preprocess frames {sample!r} as {framed}, which does not hold the "
            f"tokenizer's own ids {own}; export its `.tokenizer` instead"
        )
    packer = preprocessor.encoder_packer
    return Framing(
        source=name + ENCODER_SOURCE,
        start=_tokens(tokenizer, framed[:at]),
        end=_tokens(tokenizer, framed[at + len(own) :]),
        sequence_length=preprocessor.encoder_sequence_length,
        pad_token=_pad_token(tokenizer, packer.pad_value),
        padding_side=packer.padding_side,
    )


def _piece(token: str, type_id: int) -> dict:
    return {"SpecialToken": {"id": token, "type_id": type_id}}


def _sequence(name: str, type_id: int) -> dict:
    return {"Sequence": {"id": name, "type_id": type_id}}


def post_processor(start: tuple, end: tuple, separator: tuple | None, vocabulary_id) -> dict | None:
    """A `TemplateProcessing` post-processor for the given special tokens.

    Args:
        start: tokens before the first segment.
        end: tokens after the last segment.
        separator: tokens between two segments (None: the second segment
            follows the first directly).
        vocabulary_id: token text -> id.

    Returns:
        The post-processor, or None when no token is added.
    """
    if not (start or end or separator):
        return None
    single = [_piece(t, 0) for t in start] + [_sequence("A", 0)] + [_piece(t, 0) for t in end]
    pair = [_piece(t, 0) for t in start] + [_sequence("A", 0)]
    pair += [_piece(t, 0) for t in separator or ()] + [_sequence("B", 1)]
    pair += [_piece(t, 1) for t in end]
    tokens = dict.fromkeys(start + end + (separator or ()))
    special = {t: {"id": t, "ids": [int(vocabulary_id(t))], "tokens": [t]} for t in tokens}
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special}


def truncation_and_padding(framing: Framing, vocabulary_id) -> tuple:
    """`tokenizer.json`'s `truncation` and `padding` entries for `framing`.

    Args:
        framing: the preprocessor's framing.
        vocabulary_id: token text -> id.

    Returns:
        (truncation, padding), each None when keras-hub does not do it.
    """
    if not framing.sequence_length:
        return None, None
    truncation = {
        "direction": "Right",
        "max_length": int(framing.sequence_length),
        "strategy": TRUNCATION.get(framing.truncate, "LongestFirst"),
        "stride": 0,
    }
    if framing.pad_token is None:
        return truncation, None
    padding = {
        "strategy": {"Fixed": int(framing.sequence_length)},
        "direction": "Left" if framing.padding_side == "left" else "Right",
        "pad_to_multiple_of": None,
        "pad_id": int(vocabulary_id(framing.pad_token)),
        "pad_type_id": 0,
        "pad_token": framing.pad_token,
    }
    return truncation, padding
