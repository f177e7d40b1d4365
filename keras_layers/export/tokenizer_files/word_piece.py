"""WordPiece (`WordPieceTokenizer`, `BertTokenizer` and kin) as `tokenizer.json`.

keras-hub's eager path is plain Python (`pretokenize_python` and a greedy
longest-match loop), so each of its rules is rewritten in the `tokenizers`
vocabulary, not borrowed from Hugging Face's BERT, whose rules differ:

- accents: Unicode NFD, then every nonspacing mark (Mn) dropped (`NFD` and a
  `Replace` of `\\p{Mn}`: `StripAccents` drops spacing and enclosing marks
  too);
- splitting: keras-hub drops ASCII whitespace `[ \\t\\n\\r\\f]` and the Cc and Cf
  categories, and keeps as one-character words ASCII punctuation, `\\p{P}` and
  the CJK ideograph blocks. `BertPreTokenizer` splits on every Unicode
  whitespace (a no-break space too), so two `Split` steps with keras-hub's own
  classes are written instead;
- lowercasing: keras-hub applies NFKC_Casefold (`casefold_utf8`: NFKC, full
  case folding, NFKC, default-ignorable code points dropped). `Lowercase` is
  Rust's lowercasing, not case folding, so the normalizer is NFKC, Lowercase,
  one `Replace` per character whose case folding differs from its lower case
  (`ß` -> `ss`, final sigma, Cherokee), NFKC and a `Replace` that drops the
  default ignorables. keras-hub lowercases each word after splitting, so a
  delimiter is never dropped as ignorable (the split drops it), and what
  folding makes inside a word that the split would act on (a no-break space
  folds to a space, '⑴' to '(1)', '…' to '...') is spelled with placeholders
  no split step matches (`PLACEHOLDERS`), with aliases of the vocabulary's
  tokens in that spelling and a decoder that restores the characters. The
  steps are then checked against keras-hub's function
  on every code point of the planes in use, and each character where the two
  Unicode tables disagree (Python's `unicodedata` against the Rust crates
  `tokenizers` is built with) gets a `Replace` of its own in front;
- `special_tokens_in_strings`: the special tokens become added tokens (matched
  before normalization, never lowercased), as keras-hub keeps them whole.

What stays different is known and measured: keras-hub's word limit is 100
UTF-8 bytes where `max_input_chars_per_word` counts characters, and a text
holding a placeholder code point itself (U+10F000 on) reads as the character
it stands for. onnxruntime-extensions has no
WordPiece tokenizer.json reader; its BERT operator is measured, not matched.
"""

import functools
import unicodedata

from keras_layers.export.tokenizer_files.byte_pair import special_token_roles
from keras_layers.export.tokenizer_files.converted import Converted, added_token, document

# keras-hub's `word_piece_tokenizer.PY_*_REGEX` classes, in Oniguruma syntax.
WHITESPACE = r"[ \t\n\r\f]|\p{Cc}|\p{Cf}"
PUNCTUATION = r"[!-/]|[:-@]|[\[-`]|[{-~]|\p{P}"
CJK = (
    r"[\x{4E00}-\x{9FFF}]|[\x{3400}-\x{4DBF}]|[\x{20000}-\x{2A6DF}]|[\x{2A700}-\x{2B73F}]"
    r"|[\x{2B740}-\x{2B81F}]|[\x{2B820}-\x{2CEAF}]|[\x{F900}-\x{FAFF}]|[\x{2F800}-\x{2FA1F}]"
)
# Placeholders for characters that lowercasing makes inside a word (keras-hub
# lowercases after splitting, so the word stays whole): code points of the
# last private use plane, which no split step matches and which NFKC and
# lowercasing leave alone.
PLACEHOLDERS = 0x10F000
# keras-hub's `MAX_BYTES_PER_WORD`, which `tokenizers` counts in characters.
MAX_WORD = 100
# Planes with assigned characters (BMP, SMP, SIP, TIP, SSP): the others map
# to themselves under every normalization both libraries know.
_PLANES = ((0, 0x40000), (0xE0000, 0xE1000))

PLACEHOLDER_GAP = (
    "a text holding one of the placeholder code points (U+10F000 on) itself reads as the "
    "character it stands for"
)
WORD_LIMIT_GAP = (
    "keras-hub maps a word over 100 UTF-8 bytes to the unknown token, tokenizers a word over "
    "100 characters"
)
BERT_OP_GAP = (
    "onnxruntime-extensions reads no WordPiece tokenizer.json; its BertTokenizer operator "
    "(fed this vocabulary) splits on all Unicode whitespace, removes control characters and "
    "lowercases without NFKC case folding"
)


def _code_points():
    for start, stop in _PLANES:
        for point in range(start, stop):
            if not 0xD800 <= point < 0xE000:
                yield chr(point)


def _changed(normalizer, chars: list) -> list:
    """What `normalizer` makes of each of `chars`."""
    results = []
    for start in range(0, len(chars), 4096):
        chunk = chars[start : start + 4096]
        # A newline separates the characters: no step changes or composes it.
        done = normalizer.normalize_str("\n".join(chunk)).split("\n")
        results += done if len(done) == len(chunk) else [normalizer.normalize_str(c) for c in chunk]
    return results


def _mismatches(steps: list, expected: dict) -> dict:
    """Characters the normalizer `steps` maps otherwise than `reference` does.

    Only characters that `expected` changes or that the steps other than
    `Replace` of a string change can differ (a string `Replace` touches
    characters `expected` changes), so only those are run through all the
    steps: a few thousand instead of a quarter million.
    """
    chars = list(expected)
    general = [
        step for step in steps if not (step["type"] == "Replace" and "String" in step["pattern"])
    ]
    base = _changed(_build(general), chars)
    domain = [
        char
        for char, done in zip(chars, base, strict=True)
        if done != char or expected[char] != char
    ]
    results = _changed(_build(steps), domain)
    return {
        char: expected[char]
        for char, done in zip(domain, results, strict=True)
        if done != expected[char]
    }


def _build(steps: list):
    import json

    from tokenizers import Tokenizer

    # `tokenizers` builds a normalizer from its JSON form through a tokenizer.
    shell = document({"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"})
    shell["normalizer"] = {"type": "Sequence", "normalizers": steps}
    return Tokenizer.from_str(json.dumps(shell)).normalizer


def _replace(old: str, new: str) -> dict:
    return {"type": "Replace", "pattern": {"String": old}, "content": new}


def _patched(steps: list, expected: dict) -> list:
    """`steps`, preceded by a `Replace` for each character they get wrong.

    Args:
        steps: the normalizer steps.
        expected: every code point -> what keras-hub makes of it.

    Returns:
        The steps with the patches in front.
    """
    patches = {}
    for _ in range(3):
        found = _mismatches([_replace(a, b) for a, b in patches.items()] + steps, expected)
        if not found:
            break
        patches.update(found)
    return [_replace(old, new) for old, new in patches.items()] + steps


def _strip_accents(text: str) -> str:
    text = unicodedata.normalize("NFD", text)
    return "".join(char for char in text if unicodedata.category(char) != "Mn")


@functools.lru_cache(maxsize=1)
def accent_steps() -> tuple:
    """The normalizer steps for keras-hub's `strip_accents`, checked.

    Returns:
        `NFD`, `StripAccents`, preceded by a `Replace` for each character the
        two Unicode tables disagree on.
    """
    steps = [{"type": "NFD"}, {"type": "Replace", "pattern": {"Regex": r"\p{Mn}"}, "content": ""}]
    return tuple(_patched(steps, {char: _strip_accents(char) for char in _code_points()}))


def _split_classes(split_on_cjk: bool) -> tuple:
    """keras-hub's own regexes: what its split drops, and what it keeps as one-character words."""
    import regex
    from keras_hub.src.tokenizers import word_piece_tokenizer as keras_word_piece

    kept = keras_word_piece.PY_PUNCTUATION_REGEX
    if split_on_cjk:
        kept = f"{kept}|{keras_word_piece.PY_CJK_REGEX}"
    return regex.compile(keras_word_piece.PY_WHITESPACE_REGEX), regex.compile(kept)


class _Hider:
    """Spells characters the split would act on with placeholders, one each."""

    def __init__(self, dropped, kept):
        self.dropped, self.kept, self.placeholders = dropped, kept, {}

    def splits(self, char: str) -> bool:
        return bool(self.dropped.fullmatch(char) or self.kept.fullmatch(char))

    def hide(self, text: str) -> str:
        hidden = []
        for char in text:
            if self.splits(char):
                char = self.placeholders.setdefault(
                    char, chr(PLACEHOLDERS + len(self.placeholders))
                )
            hidden.append(char)
        return "".join(hidden)


def _in_word(char: str, fold: str, hider: _Hider) -> str:
    """What the normalizer must make of `char` so the split sees keras-hub's words."""
    if hider.dropped.fullmatch(char):
        return char  # dropped by the split before keras-hub lowercases anything
    if hider.kept.fullmatch(char):
        if fold == char or (len(fold) == 1 and hider.kept.fullmatch(fold)):
            return fold
        # A one-character word whose folding is longer ('…' -> '...'): one
        # word still, set apart by spaces the split drops.
        return " " + hider.hide(fold) + " "
    return hider.hide(fold) if any(hider.splits(c) for c in fold) else fold


@functools.lru_cache(maxsize=4)
def lowercase_steps(split: bool, split_on_cjk: bool) -> tuple:
    """The normalizer steps for keras-hub's `lowercase` (NFKC_Casefold), checked.

    Args:
        split: whether the tokenizer splits words (else the text is one word).
        split_on_cjk: whether its split sets CJK ideographs apart.

    Returns:
        (steps, placeholders): the steps (see the module docstring), each
        character where they disagree with keras-hub patched in front, and
        character -> the placeholder that spells it inside a word.
    """
    from keras_hub.src.utils.tensor_utils import _is_default_ignorable, casefold_utf8

    hider = _Hider(*_split_classes(split_on_cjk))
    expected, folds, ignorable = {}, [], []
    for char in _code_points():
        fold = casefold_utf8(char)
        expected[char] = _in_word(char, fold, hider) if split else fold
        if char.casefold() != char and char.lower() == char:
            folds.append(_replace(char, char.casefold()))
        if _is_default_ignorable(char) and not (split and hider.dropped.fullmatch(char)):
            ignorable.append(ord(char))
    steps = [
        {"type": "NFKC"},
        {"type": "Lowercase"},
        *folds,
        {"type": "NFKC"},
        {"type": "Replace", "pattern": {"Regex": _character_class(ignorable)}, "content": ""},
    ]
    return tuple(_patched(steps, expected)), dict(hider.placeholders)


def _character_class(points: list) -> str:
    ranges = []
    for point in points:
        if ranges and ranges[-1][1] == point - 1:
            ranges[-1][1] = point
        else:
            ranges.append([point, point])
    parts = [
        f"\\x{{{low:X}}}" if low == high else f"\\x{{{low:X}}}-\\x{{{high:X}}}"
        for low, high in ranges
    ]
    return "[" + "".join(parts) + "]"


def _pre_tokenizer(tokenizer) -> dict | None:
    if not tokenizer.split:
        return None
    kept = f"{PUNCTUATION}|{CJK}" if tokenizer.split_on_cjk else PUNCTUATION
    return {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": WHITESPACE},
                "behavior": "Removed",
                "invert": False,
            },
            {"type": "Split", "pattern": {"Regex": kept}, "behavior": "Isolated", "invert": False},
        ],
    }


def _split_tokens(tokenizer) -> list:
    if not (tokenizer.split and tokenizer.special_tokens_in_strings):
        return []
    tokens = list(tokenizer.special_tokens) + list(tokenizer._init_special_tokens or ())
    return list(dict.fromkeys(tokens))


def _decoder(suffix: str, placeholders: dict) -> dict:
    pieces = {"type": "WordPiece", "prefix": suffix, "cleanup": False}
    if not placeholders:
        return pieces
    restore = [
        {"type": "Replace", "pattern": {"String": placeholder}, "content": char}
        for char, placeholder in placeholders.items()
    ]
    return {"type": "Sequence", "decoders": [pieces, *restore]}


def _aliases(vocabulary: dict, suffix: str, placeholders: dict) -> dict:
    """The tokens spelled with placeholders, for words lowercasing made."""
    aliases = {}
    for token, index in vocabulary.items():
        prefix = suffix if token.startswith(suffix) and len(token) > len(suffix) else ""
        body = token[len(prefix) :]
        if any(char in placeholders for char in body):
            aliases[prefix + "".join(placeholders.get(char, char) for char in body)] = index
    return aliases


def convert_word_piece(tokenizer) -> Converted:
    """A keras-hub `WordPieceTokenizer` as `tokenizer.json`.

    Args:
        tokenizer: the tokenizer (BERT, DistilBERT, ELECTRA, ... subclasses).

    Returns:
        The conversion.
    """
    vocabulary = {token: index for index, token in enumerate(tokenizer.vocabulary)}
    steps, placeholders = list(accent_steps()) if tokenizer.strip_accents else [], {}
    if tokenizer.lowercase:
        lowercase, placeholders = lowercase_steps(tokenizer.split, tokenizer.split_on_cjk)
        steps += lowercase
        vocabulary.update(_aliases(vocabulary, tokenizer.suffix_indicator, placeholders))
    model = {
        "type": "WordPiece",
        "unk_token": tokenizer.oov_token,
        "continuing_subword_prefix": tokenizer.suffix_indicator,
        "max_input_chars_per_word": MAX_WORD,
        "vocab": vocabulary,
    }
    added = [
        added_token(token, vocabulary[token])
        for token in _split_tokens(tokenizer)
        if token in vocabulary
    ]
    gaps = [WORD_LIMIT_GAP] + ([PLACEHOLDER_GAP] if placeholders else [])
    return Converted(
        family="WordPiece",
        document=document(
            model,
            normalizer={"type": "Sequence", "normalizers": steps} if steps else None,
            pre_tokenizer=_pre_tokenizer(tokenizer),
            decoder=_decoder(tokenizer.suffix_indicator, placeholders),
            added=added,
        ),
        tokenizer_class="BertTokenizer",
        special_tokens=special_token_roles(tokenizer),
        known_gaps={"tokenizers": gaps, "onnxruntime-extensions": [BERT_OP_GAP]},
        # BERT's names for the flags (transformers, onnxruntime-extensions' operator).
        config={
            "do_lower_case": bool(tokenizer.lowercase),
            "strip_accents": bool(tokenizer.strip_accents),
            "tokenize_chinese_chars": bool(tokenizer.split_on_cjk),
        },
    )
