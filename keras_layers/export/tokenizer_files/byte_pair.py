r"""Byte-level BPE (`BytePairTokenizer` and its model subclasses) as `tokenizer.json`.

keras-hub's eager path (what `tokenizer(text)` runs) is a `tokenizers.Tokenizer`
built from the layer's public state: a BPE model over `vocabulary` and
`merges`, the `unsplittable_tokens` as special added tokens, a pre-tokenizer
and the `ByteLevel` decoder. The file below rebuilds exactly that.

The pre-tokenizer is where care is needed. keras-hub hands its regex (Llama
3's, `KERAS_HUB_SPLIT_PATTERN`) to `pre_tokenizers.Split` as a Python string,
which `tokenizers` matches as literal text, not as a regex: the eager path
never pre-splits, and BPE runs over the whole text (keras-hub 0.32; the
`tf.data` path splits GPT-2 style, and the two agree wherever the vocabulary's
merges never cross a word boundary). The file says "no split" as a regex that
takes the whole text (`[\s\S]+`), which both `tokenizers` and
onnxruntime-extensions' regex fallback read; writing keras-hub's literal
string instead would send onnxruntime-extensions to its GPT-2 default.
tests/test_tokenizer_files.py pins keras-hub's behaviour, so an upgrade that
changes it fails there first.
"""

from keras_layers.export.tokenizer_files.converted import (
    EMPTY_DECODE_GAP,
    NUL_GAP,
    Converted,
    added_token,
    document,
)

# keras-hub's `byte_pair_tokenizer.SPLIT_PATTERN_TOKENIZERS` (Llama 3's), which
# its eager path matches as a literal string (see the module docstring).
KERAS_HUB_SPLIT_PATTERN = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
# The whole text as one piece: what a literal-string split of ordinary text does.
WHOLE_TEXT = r"[\s\S]+"

PREFIX_SPACE_GAP = (
    "onnxruntime-extensions ignores `ByteLevel.add_prefix_space`: no space is put before the text"
)


def _merges(merges) -> list:
    pairs = []
    for merge in merges:
        if "#version:" in merge.lstrip():
            continue
        left, right = str(merge).split(" ")
        pairs.append([left, right])
    return pairs


def _pre_tokenizer(add_prefix_space: bool) -> dict:
    return {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": WHOLE_TEXT},
                "behavior": "Isolated",
                "invert": False,
            },
            {
                "type": "ByteLevel",
                "add_prefix_space": bool(add_prefix_space),
                "trim_offsets": True,
                "use_regex": False,
            },
        ],
    }


def special_token_roles(tokenizer) -> dict:
    """The tokenizer's special tokens under `tokenizer_config.json`'s role names.

    Args:
        tokenizer: a keras-hub tokenizer whose special tokens are attributes
            (`start_token`, `end_token`, `pad_token`, `cls_token`, ...).

    Returns:
        role -> token text (`{"bos_token": "<|endoftext|>", ...}`); a pad id
        without a pad token is named by the id's token.
    """
    roles = {}
    for attribute, role in (
        ("start_token", "bos_token"),
        ("end_token", "eos_token"),
        ("pad_token", "pad_token"),
        ("cls_token", "cls_token"),
        ("sep_token", "sep_token"),
        ("mask_token", "mask_token"),
        ("oov_token", "unk_token"),
    ):
        token = getattr(tokenizer, attribute, None)
        if isinstance(token, str):
            roles[role] = token
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if "pad_token" not in roles and isinstance(pad_id, int):
        roles["pad_token"] = tokenizer.id_to_token(pad_id)
    return roles


def convert_byte_pair(tokenizer) -> Converted:
    """A keras-hub `BytePairTokenizer` as `tokenizer.json`.

    Args:
        tokenizer: the tokenizer (GPT-2, Llama 3, Qwen, ... subclasses).

    Returns:
        The conversion.
    """
    vocabulary = dict(tokenizer.vocabulary)
    added = [
        added_token(token, vocabulary[token], special=True)
        for token in dict.fromkeys(tokenizer.unsplittable_tokens or ())
        if token in vocabulary
    ]
    model = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": vocabulary,
        "merges": _merges(tokenizer.merges),
    }
    decoder = {
        "type": "ByteLevel",
        "add_prefix_space": True,
        "trim_offsets": True,
        "use_regex": True,
    }
    gaps = {
        "onnxruntime-extensions": [NUL_GAP, EMPTY_DECODE_GAP]
        + ([PREFIX_SPACE_GAP] if tokenizer.add_prefix_space else [])
    }
    return Converted(
        family="byte-level BPE",
        document=document(
            model,
            pre_tokenizer=_pre_tokenizer(tokenizer.add_prefix_space),
            decoder=decoder,
            added=added,
        ),
        tokenizer_class="PreTrainedTokenizerFast",
        special_tokens=special_token_roles(tokenizer),
        known_gaps=gaps,
    )
