"""The tokenizer of every keras-hub text model of the zoo, built tiny and offline.

Shared by tests/test_zoo_tokenizers.py and benchmarks/tokenizer_speed.py, so the
tests and the page's table are about the same tokenizers.

Enumeration (programmatic, never a hand-picked list): for every zoo model
(tests/zoo_models.py, the classes that pass step 1 of its rule), a task's
`preprocessor_cls.tokenizer_cls`; a backbone gets the tokenizers of its tasks,
or, when no task has it, the tokenizer classes keras-hub registers for it
(`Tokenizer.backbone_cls`). The classes are deduplicated; each keeps the list
of zoo models it serves (the zoo table's tokenizer column joins on it).

The family is the keras-hub base class the tokenizer subclasses
(`BytePairTokenizer`, `SentencePieceTokenizer`, `WordPieceTokenizer`), or
"other". Each class gets a vocabulary trained here on `TRAINING` (a few
sentences and the stress corpus): byte-level BPE merges by `tokenizers`' BPE
trainer, a SentencePiece proto by `sentencepiece`'s trainer (BPE, byte
fallback, no normalisation, as Llama/Gemma-style models are trained), a
WordPiece vocabulary by keras-hub's `compute_word_piece_vocabulary`.

The special tokens each class requires are read off the class, never listed
here: the class is first built with its vocabulary argument None, and its
`_special_token_attrs` (what `Tokenizer._add_special_token` recorded) name the
tokens and their roles; `oov_token`/`unk_token` too. Should a class still
refuse the vocabulary with keras-hub's "Cannot find special token `'X'`"
error, X is added and the vocabulary trained again. In a SentencePiece proto,
the tokens of the framing roles (start, end, pad, unknown, ...) become control
pieces, as SentencePiece's own `<s>`/`</s>` are; the others (`<start_of_turn>`,
`<|image_pad|>`) user-defined pieces, matched in text, as in the presets.
"""

import functools
import inspect
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo_models  # noqa: E402

FAMILIES = ("BytePairTokenizer", "SentencePieceTokenizer", "WordPieceTokenizer")
VOCABULARY_ARGUMENTS = ("vocabulary", "merges", "proto")
# Roles whose token frames a text or stands for one: a control piece in SentencePiece.
CONTROL_ROLES = re.compile(r"(start|end|bos|eos|pad|unk|cls|sep|mask|oov)_token")
# keras-hub's refusals naming a missing token ("special token" in `Tokenizer`,
# "token ... in the provided `special_tokens`" where a class takes them as a dict).
MISSING = re.compile(r"Cannot find (special )?token `'(?P<token>.+?)'`")
TRAINING_SENTENCES = [
    "The quick brown fox jumps over the lazy dog. A tokenizer splits words into pieces.",
    "Machine learning models turn text into token ids and back again, 123 and 4567 times.",
    "Emails like user@example.org and URLs like https://keras.io/api appear in text.",
    "Привет мир, καλημέρα κόσμε, 你好世界, नमस्ते दुनिया, مرحبا بالعالم, שלום עולם.",
]
BPE_VOCABULARY = 500
SENTENCE_PIECE_VOCABULARY = 700
WORD_PIECE_VOCABULARY = 500


def training_corpus() -> list:
    """The texts every vocabulary is trained on: four sentences, and the stress corpus."""
    from keras_layers.export.tokenizer_files import STRESS_CORPUS

    return TRAINING_SENTENCES * 10 + [text for text in STRESS_CORPUS if text.strip()]


@dataclass(frozen=True)
class ZooTokenizer:
    """One tokenizer class of the zoo: its family and the zoo models it serves."""

    name: str
    family: str  # the keras-hub base class's name, or "other"
    models: tuple = ()
    cls: type = field(default=None, repr=False, compare=False)


def family_of(cls) -> str:
    """The keras-hub base class `cls` subclasses, or "other"."""
    from keras_hub import tokenizers

    for name in FAMILIES:
        if issubclass(cls, getattr(tokenizers, name)):
            return name
    return "other"


def _registered(backbone_cls) -> list:
    from keras_hub.tokenizers import Tokenizer

    return [
        cls
        for cls in zoo_models._public_classes()
        if issubclass(cls, Tokenizer) and getattr(cls, "backbone_cls", None) is backbone_cls
    ]


def _task_tokenizer(cls):
    preprocessor = getattr(cls, "preprocessor_cls", None)
    return getattr(preprocessor, "tokenizer_cls", None)


@functools.cache
def enumerate_tokenizers() -> tuple:
    """Every tokenizer class of the zoo's models, by name, with the models it serves."""
    models = zoo_models.candidates()
    served = {}
    by_backbone = {}
    for model in models:
        if model.kind != "backbone":
            tokenizer = _task_tokenizer(model.cls)
            if tokenizer is not None:
                served.setdefault(tokenizer, []).append(model.name)
                by_backbone.setdefault(model.backbone, []).append(tokenizer)
    for model in models:
        if model.kind != "backbone":
            continue
        found = by_backbone.get(model.name) or _registered(model.cls)
        for tokenizer in dict.fromkeys(found):
            served.setdefault(tokenizer, []).append(model.name)
    return tuple(
        ZooTokenizer(cls.__name__, family_of(cls), tuple(sorted(names)), cls)
        for cls, names in sorted(served.items(), key=lambda item: item[0].__name__)
    )


def by_name(name: str) -> ZooTokenizer:
    """The enumerated tokenizer class `name` (KeyError if no zoo model uses it)."""
    for tokenizer in enumerate_tokenizers():
        if tokenizer.name == name:
            return tokenizer
    raise KeyError(f"{name} is not the tokenizer of a zoo model")


# --- the special tokens a class requires, read off the class -----------------------------


def _takes_token_dict(cls) -> bool:
    """Whether `cls` takes its special tokens as a `special_tokens` dict (token -> id)."""
    return "special_tokens" in inspect.signature(cls.__init__).parameters


def _empty(cls):
    """`cls` built with None for every argument it requires (its vocabulary).

    A class that takes its special tokens as a dict gets, one by one, each
    token its refusal names (with a placeholder id).
    """
    required = {
        parameter.name: None
        for parameter in list(inspect.signature(cls.__init__).parameters.values())[1:]
        if parameter.default is inspect.Parameter.empty
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    }
    given = {}
    while True:
        try:
            if _takes_token_dict(cls):
                return cls(**required, special_tokens=dict(given))
            return cls(**required)
        except ValueError as error:
            missing = MISSING.search(str(error))
            if missing is None or missing["token"] in given or not _takes_token_dict(cls):
                raise
            given[missing["token"]] = len(given)


@functools.cache
def special_tokens(cls) -> tuple:
    """(role, token) pairs `cls` requires in its vocabulary, read off an empty instance."""
    empty = _empty(cls)
    roles = {attr: getattr(empty, attr) for attr in getattr(empty, "_special_token_attrs", [])}
    for index, token in enumerate(getattr(empty, "_special_token_dict", None) or {}):
        roles.setdefault(f"special_token_{index}", token)
    for attr in ("oov_token", "unk_token"):
        if isinstance(getattr(empty, attr, None), str):
            roles.setdefault(attr, getattr(empty, attr))
    pairs = {}
    for role, token in roles.items():
        if isinstance(token, str) and token:
            pairs.setdefault(token, role)
    return tuple((role, token) for token, role in pairs.items())


# --- vocabularies trained here -----------------------------------------------------------


@functools.cache
def byte_pair_vocabulary(specials: tuple) -> tuple:
    """(vocabulary, merges) of a byte-level BPE trained with `specials` as added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCABULARY,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trained.train_from_iterator(training_corpus(), trainer)
    model = json.loads(trained.to_str())["model"]
    return model["vocab"], [" ".join(pair) for pair in model["merges"]]


_SENTENCE_PIECE_OWN = {"<unk>", "<s>", "</s>"}


@functools.cache
def sentence_piece_proto(control: tuple, user_defined: tuple) -> bytes:
    """A SentencePiece BPE proto with byte fallback and the given extra pieces.

    Args:
        control: tokens to add as control pieces (never matched in text).
        user_defined: tokens to add as user-defined pieces (matched in text).

    Returns:
        The serialized model proto.
    """
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(training_corpus()),
        model_writer=model,
        vocab_size=SENTENCE_PIECE_VOCABULARY,
        character_coverage=0.98,
        hard_vocab_limit=False,
        minloglevel=2,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        control_symbols=[t for t in control if t not in _SENTENCE_PIECE_OWN],
        user_defined_symbols=[t for t in user_defined if t not in _SENTENCE_PIECE_OWN],
    )
    return model.getvalue()


@functools.cache
def word_piece_vocabulary(reserved: tuple, lowercase: bool) -> tuple:
    """A WordPiece vocabulary trained by keras-hub, `reserved` first.

    Args:
        reserved: the special tokens, at the vocabulary's start.
        lowercase: whether the trainer lowercases (as the tokenizer will).

    Returns:
        The vocabulary, as a tuple of tokens.
    """
    import tensorflow as tf
    from keras_hub.tokenizers import compute_word_piece_vocabulary

    texts = tf.data.Dataset.from_tensor_slices(training_corpus())
    return tuple(
        compute_word_piece_vocabulary(
            texts,
            vocabulary_size=WORD_PIECE_VOCABULARY,
            lowercase=lowercase,
            reserved_tokens=list(reserved),
        )
    )


def _vocabulary_arguments(cls, family: str, tokens: tuple) -> dict:
    """The constructor's vocabulary arguments for `family`, with `tokens` (role, token) in."""
    texts = tuple(token for _, token in tokens)
    if family == "BytePairTokenizer":
        vocabulary, merges = byte_pair_vocabulary(texts)
        arguments = {"vocabulary": vocabulary, "merges": merges}
        if _takes_token_dict(cls):
            arguments["special_tokens"] = {token: vocabulary[token] for token in texts}
        return arguments
    if family == "SentencePieceTokenizer":
        control = tuple(token for role, token in tokens if CONTROL_ROLES.fullmatch(role))
        user = tuple(token for role, token in tokens if not CONTROL_ROLES.fullmatch(role))
        return {"proto": sentence_piece_proto(control, user)}
    lowercase = bool(getattr(_empty(cls), "lowercase", False))
    return {"vocabulary": list(word_piece_vocabulary(texts, lowercase))}


def build(name: str, attempts: int = 8):
    """The tokenizer class `name`, built with a vocabulary trained here.

    Args:
        name: a tokenizer class of the zoo (`enumerate_tokenizers`).
        attempts: how many times a special token named by keras-hub's
            "Cannot find special token" error is added before giving up.

    Returns:
        The tokenizer.

    Raises:
        ValueError: its family has no vocabulary trainer here ("other"), or
            it still refuses the vocabulary after `attempts` tokens added.
    """
    entry = by_name(name)
    if entry.family == "other":
        raise ValueError(f"{name} is none of {', '.join(FAMILIES)}: no vocabulary to train")
    tokens = special_tokens(entry.cls)
    for _ in range(attempts):
        try:
            return entry.cls(**_vocabulary_arguments(entry.cls, entry.family, tokens))
        except ValueError as error:
            missing = MISSING.search(str(error))
            if missing is None:
                raise
            tokens += (("extra_token", missing["token"]),)
    raise ValueError(f"{name} refused the vocabulary with {len(tokens)} special tokens added")


def representatives() -> dict:
    """One tokenizer per family (the first of the family by name), for the default suite."""
    chosen = {}
    for entry in enumerate_tokenizers():
        chosen.setdefault(entry.family, entry.name)
    return chosen


# --- refusals: the classes `export_tokenizer` cannot write, and why ----------------------

# Tokenizer class -> words its UsageError must hold. The test asserts each is
# refused with them; once one exports (a converter learns it), the test fails
# and the entry goes.
REFUSED = {
    "DebertaV3Tokenizer": (
        "overrides",
        "keras-hub appends [MASK] past the SentencePiece vocabulary when the proto has none, "
        "in code around the proto that a tokenizer.json cannot hold",
    ),
    "XLMRobertaTokenizer": (
        "overrides",
        "keras-hub shifts every SentencePiece id by one, puts <s>, <pad>, </s>, <unk> first "
        "(fairseq's order) and appends <mask>, in code around the proto that a tokenizer.json "
        "cannot hold",
    ),
    "RWKVTokenizer": (
        "none of BytePairTokenizer",
        "RWKV's own trie tokenizer over a byte vocabulary, no BPE, SentencePiece or WordPiece",
    ),
}


def instance(name: str):
    """The tokenizer to export: `build(name)`, or, for a family with no trainer here,
    the class built empty (what is refused is the class, not a vocabulary)."""
    entry = by_name(name)
    if entry.family == "other":
        return _empty(entry.cls)
    return build(name)


# --- preprocessors: the framing of every zoo task's preprocessor -------------------------

# Preprocessor class -> words its UsageError must hold. Sequence-to-sequence
# preprocessors pack an encoder and a decoder input (two packers): one
# tokenizer.json frames one input, so their tokenizer is exported alone.
PREPROCESSOR_REFUSED = {
    # It frames text with images: keras-hub's own call needs them.
    "PaliGemmaCausalLMPreprocessor": "cannot frame a batch of texts alone",
}
LENGTHS = ("sequence_length", "encoder_sequence_length", "decoder_sequence_length")
SEQUENCE_LENGTH = 24


@dataclass(frozen=True)
class ZooPreprocessor:
    """One preprocessor class of the zoo's tasks, its tokenizer and the tasks it serves."""

    name: str
    tokenizer: str
    models: tuple = ()
    cls: type = field(default=None, repr=False, compare=False)


def _text_only(cls) -> bool:
    """Whether `cls` is built from a tokenizer alone (no audio or image converter)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return not [
        p.name
        for p in parameters
        if p.name not in ("self", "tokenizer")
        and p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


@functools.cache
def enumerate_preprocessors() -> tuple:
    """Every text-only preprocessor class of the zoo's tasks whose tokenizer exports."""
    served = {}
    for model in zoo_models.candidates():
        cls = getattr(model.cls, "preprocessor_cls", None) if model.kind != "backbone" else None
        tokenizer = getattr(cls, "tokenizer_cls", None)
        if tokenizer is None or tokenizer.__name__ in REFUSED or not _text_only(cls):
            continue
        served.setdefault(cls, []).append(model.name)
    return tuple(
        ZooPreprocessor(cls.__name__, cls.tokenizer_cls.__name__, tuple(sorted(names)), cls)
        for cls, names in sorted(served.items(), key=lambda item: item[0].__name__)
    )


def build_preprocessor(name: str):
    """The preprocessor class `name` around its tokenizer built here, at `SEQUENCE_LENGTH`."""
    entry = next(entry for entry in enumerate_preprocessors() if entry.name == name)
    parameters = inspect.signature(entry.cls.__init__).parameters
    lengths = {key: SEQUENCE_LENGTH for key in LENGTHS if key in parameters}
    if not lengths and any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        lengths = {"sequence_length": SEQUENCE_LENGTH}  # passed on to its base class
    return entry.cls(tokenizer=build(entry.tokenizer), **lengths)
