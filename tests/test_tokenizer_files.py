"""keras-hub tokenizers written as Hugging Face tokenizer files, and the proof they match.

Every tokenizer is built here from a vocabulary trained on a few sentences
(tokenizers' BPE trainer, SentencePiece's trainer, keras-hub's WordPiece
trainer), never downloaded. Each case is exported, then `check_identity` runs
the stress corpus through keras-hub and both readers (`tokenizers` and
onnxruntime-extensions); every difference it reports must be one of the
corners the converter documents, named per case below, and the corners are
checked to be the only ones. Then the proof is proved: files broken on
purpose (two ids swapped, a merge dropped, lowercasing removed) must be
caught, with the differing text and both id lists, and `export_tokenizer`'s
gate must refuse to place them (exit 1 on the command line: test_text_cli.py).
"""

import io
import json
import unicodedata

import keras_hub
import pytest
import sentencepiece
import tensorflow as tf
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from keras_layers.export.errors import OutputError, UsageError, ValidationFailed
from keras_layers.export.tokenizer_files import (
    STRESS_CORPUS,
    check_identity,
    export_tokenizer,
    gate,
)
from keras_layers.export.tokenizer_files.byte_pair import KERAS_HUB_SPLIT_PATTERN
from keras_layers.export.tokenizer_files.sentence_piece import (
    BPE,
    BYTE,
    CONTROL,
    NORMAL,
    derive_merges,
    model_proto,
)

EXTENSIONS = "onnxruntime-extensions"
FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
TRAINING = [
    "The quick brown fox jumps over the lazy dog. A tokenizer splits words into pieces.",
    "Machine learning models turn text into token ids and back again, 123 and 4567 times.",
    "Emails like user@example.org and URLs like https://keras.io/api appear in text.",
    "Привет мир, καλημέρα κόσμε, 你好世界, नमस्ते दुनिया, مرحبا بالعالم, שלום עולם.",
] * 10 + [text for text in STRESS_CORPUS if text.strip()]
BYTE_LEVEL_SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
LLAMA3_SPECIALS = ["<|start_header_id|>", "<|end_header_id|>"]


# --- Tokenizers built here -------------------------------------------------------------


@pytest.fixture(scope="module")
def byte_level():
    """A byte-level BPE vocabulary and merges, trained by `tokenizers`."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=BYTE_LEVEL_SPECIALS + LLAMA3_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trained.train_from_iterator(TRAINING, trainer)
    model = json.loads(trained.to_str())["model"]
    return model["vocab"], [" ".join(pair) for pair in model["merges"]]


def _sentence_piece(**options) -> bytes:
    model = io.BytesIO()
    settings = dict(vocab_size=700, character_coverage=0.98, hard_vocab_limit=False, minloglevel=2)
    settings.update(options)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING), model_writer=model, **settings
    )
    return model.getvalue()


@pytest.fixture(scope="module")
def tokenizers_made(byte_level):
    """Every case's tokenizer or preprocessor, by name (built once)."""
    vocabulary, merges = byte_level
    gpt2 = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    llama3 = keras_hub.models.Llama3Tokenizer(vocabulary=vocabulary, merges=merges)
    llama = keras_hub.models.LlamaTokenizer(
        proto=_sentence_piece(
            model_type="bpe",
            byte_fallback=True,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            split_digits=True,
            pad_id=-1,
        )
    )
    gemma = keras_hub.models.GemmaTokenizer(
        proto=_sentence_piece(
            model_type="bpe",
            byte_fallback=True,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            **dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3),
            **dict(pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>"),
            user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        )
    )
    word_pieces = tf.data.Dataset.from_tensor_slices(TRAINING)
    reserved = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    uncased = keras_hub.tokenizers.compute_word_piece_vocabulary(
        word_pieces, vocabulary_size=500, lowercase=True, reserved_tokens=reserved
    )
    cased = keras_hub.tokenizers.compute_word_piece_vocabulary(
        word_pieces, vocabulary_size=500, lowercase=False, reserved_tokens=reserved
    )
    bert = keras_hub.models.BertTokenizer(vocabulary=uncased, lowercase=True)
    return {
        "gpt2": gpt2,
        "gpt2 causal lm": keras_hub.models.GPT2CausalLMPreprocessor(gpt2, sequence_length=32),
        "llama3": llama3,
        "llama3 prefix space": keras_hub.tokenizers.BytePairTokenizer(
            vocabulary=vocabulary, merges=merges, add_prefix_space=True
        ),
        "llama bpe": llama,
        "llama causal lm": keras_hub.models.LlamaCausalLMPreprocessor(llama, sequence_length=48),
        "gemma bpe": gemma,
        "sentence piece, add_bos and add_eos": keras_hub.tokenizers.SentencePieceTokenizer(
            proto=llama.proto, add_bos=True, add_eos=True
        ),
        "sentence piece bpe, nmt_nfkc, no byte fallback": keras_hub.models.LlamaTokenizer(
            proto=_sentence_piece(model_type="bpe")
        ),
        "t5 unigram": keras_hub.models.T5Tokenizer(
            proto=_sentence_piece(model_type="unigram", pad_id=3)
        ),
        "albert unigram, byte fallback": keras_hub.models.AlbertTokenizer(
            proto=_sentence_piece(
                model_type="unigram",
                byte_fallback=True,
                control_symbols=["[CLS]", "[SEP]", "[MASK]"],
                **dict(pad_id=0, unk_id=1, bos_id=-1, eos_id=-1),
            )
        ),
        "bert uncased": bert,
        "bert classifier": keras_hub.models.BertTextClassifierPreprocessor(
            bert, sequence_length=24
        ),
        "bert cased": keras_hub.models.BertTokenizer(vocabulary=cased, lowercase=False),
        "word piece, no accents, specials in text": keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=uncased,
            lowercase=True,
            strip_accents=True,
            special_tokens=["[CLS]", "[SEP]", "[MASK]"],
            special_tokens_in_strings=True,
        ),
    }


# --- The corners each reader may differ on, by case --------------------------------------


def _keras_ids(tokenizer, text: str) -> list:
    return [int(i) for i in tokenizer.tokenize(text)]


def _nul(difference, tokenizer) -> bool:
    """onnxruntime-extensions reads C strings: U+0000 ends the text."""
    return "\x00" in difference.text


def _literal_special(difference, tokenizer) -> bool:
    """The text holds a control, unknown or byte piece's literal text ('<s>', '<0x41>')."""
    pieces = model_proto(tokenizer).pieces
    literal = [piece.piece for piece in pieces if piece.type not in (NORMAL, 4)]
    return any(piece in difference.text for piece in literal)


def _marks(difference, tokenizer) -> bool:
    """The text has combining marks or conjoining jamo (`Precompiled` works per grapheme)."""
    return any(unicodedata.combining(c) or "\u1100" <= c <= "\u11ff" for c in difference.text)


def _long_word(difference, tokenizer) -> bool:
    """A word over 100 UTF-8 bytes (keras-hub's limit; tokenizers counts characters)."""
    return any(len(word.encode("utf-8")) > 100 for word in difference.text.split())


def _unknown_surface(difference, tokenizer) -> bool:
    """onnxruntime-extensions decodes the unknown piece as '<unk>', SentencePiece as ' ⁇ '."""
    return difference.check == "decode" and "\u2047" in difference.keras


def _typed_pieces(difference, tokenizer, kinds) -> bool:
    pieces = model_proto(tokenizer).pieces
    return any(pieces[i].type in kinds for i in _keras_ids(tokenizer, difference.text))


def _byte_pieces(difference, tokenizer) -> bool:
    """keras-hub fell back to bytes (onnxruntime-extensions' unigram reader does not)."""
    return _typed_pieces(difference, tokenizer, (BYTE,))


def _hex_lookalike(difference, tokenizer) -> bool:
    """A 6-byte piece with hex digits at bytes 4-5, which onnxruntime-extensions reads as <0xXY>."""
    pieces = model_proto(tokenizer).pieces
    for i in _keras_ids(tokenizer, difference.text):
        raw = pieces[i].piece.encode("utf-8")
        if len(raw) == 6 and all(chr(b) in "0123456789ABCDEF" for b in raw[3:5]):
            return True
    return False


def _ids_of(value):
    return value[0] if isinstance(value, tuple) else value


def _tie(difference, tokenizer) -> bool:
    """The same pieces in another order: equal scores, a tie broken otherwise."""
    keras, reader = _ids_of(difference.keras), _ids_of(difference.reader)
    return isinstance(reader, list) and sorted(keras) == sorted(reader)


def _long_run(difference, tokenizer) -> bool:
    """A run of over 100 characters without a space (onnxruntime-extensions chunks it)."""
    return any(len(word) > 100 for word in difference.text.split())


def _no_end_token(difference, tokenizer) -> bool:
    """onnxruntime-extensions' SentencePiece-BPE reader never appends </s>."""
    keras, reader = _ids_of(difference.keras), _ids_of(difference.reader)
    return (
        isinstance(reader, list)
        and keras[-1:] == [tokenizer.token_to_id("</s>")]
        and reader == keras[:-1]
    )


def _empty_decode(difference, tokenizer) -> bool:
    """onnxruntime-extensions' BPE decoder writes U+FFFD for an empty text."""
    return difference.check == "decode" and (difference.keras, difference.reader) == ("", "\ufffd")


def _leading_space(difference, tokenizer) -> bool:
    """onnxruntime-extensions keeps the dummy prefix when the ids do not start with <s>."""
    return difference.check == "decode" and difference.reader == " " + difference.keras


def _no_leading_space(difference, tokenizer) -> bool:
    """onnxruntime-extensions ignores `add_prefix_space`."""
    return not difference.text.startswith(" ")


# case -> (reasons `tokenizers` may differ, reasons onnxruntime-extensions may differ, or
# None where it is only measured: its BERT operator and its SentencePiece-BPE reader
# without normalizer or unknown token are other algorithms, reported, not matched).
CASES = {
    "gpt2": ((), (_nul,)),
    "gpt2 causal lm": ((), (_nul,)),
    "llama3": ((), (_nul,)),
    "llama3 prefix space": ((), (_nul, _no_leading_space)),
    "llama bpe": ((_literal_special,), (_literal_special, _nul, _leading_space, _long_run)),
    "llama causal lm": ((_literal_special,), (_literal_special, _nul, _leading_space, _long_run)),
    "gemma bpe": ((_literal_special,), (_literal_special, _nul, _long_run)),
    "sentence piece, add_bos and add_eos": (
        (_literal_special,),
        (_literal_special, _nul, _long_run, _no_end_token, _empty_decode),
    ),
    "sentence piece bpe, nmt_nfkc, no byte fallback": ((_literal_special, _marks), None),
    "t5 unigram": (
        (_literal_special, _marks, _tie),
        (_literal_special, _nul, _tie, _unknown_surface, _hex_lookalike),
    ),
    "albert unigram, byte fallback": (
        (_literal_special, _marks, _tie),
        (_literal_special, _nul, _tie, _unknown_surface, _hex_lookalike, _byte_pieces),
    ),
    "bert uncased": ((_long_word,), None),
    "bert classifier": ((_long_word,), None),
    "bert cased": ((_long_word,), None),
    "word piece, no accents, specials in text": ((), None),
}


def _unexplained(result, reasons, tokenizer) -> list:
    return [d.describe() for d in result.differences if not any(r(d, tokenizer) for r in reasons)]


@pytest.mark.parametrize(
    "case", [pytest.param(case, id=case.replace(", ", "-").replace(" ", "-")) for case in CASES]
)
def test_the_files_tokenize_the_stress_corpus_as_keras_hub(case, tokenizers_made, tmp_path):
    made = tokenizers_made[case]
    tokenizer = getattr(made, "tokenizer", made)
    written = export_tokenizer(made, tmp_path)  # its gate runs check_identity
    report = written.identity
    assert report.passed, report.summary()
    assert {p.name for p in written.files} == {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    library_reasons, extension_reasons = CASES[case]
    checks = 3 if written.framing else 2
    library = report.reader("tokenizers")
    assert library.error is None
    assert library.compared == checks * len(STRESS_CORPUS)
    assert _unexplained(library, library_reasons, tokenizer) == [], "tokenizers"
    if not library_reasons:
        assert library.identical, library.summary()
    extensions = report.reader(EXTENSIONS)
    assert extensions.error is None, extensions.error
    if extension_reasons is not None:
        assert _unexplained(extensions, extension_reasons, tokenizer) == [], EXTENSIONS
    # A reader that differs anywhere was expected to, and says why.
    for result in report.readers:
        assert result.identical or result.known_gaps, result.summary()


# --- Framing, configuration, refusals ----------------------------------------------------


def test_a_causal_lm_preprocessor_is_framed_as_generate_preprocess(tokenizers_made, tmp_path):
    preprocessor = tokenizers_made["gpt2 causal lm"]
    written = export_tokenizer(preprocessor, tmp_path, check=False)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    document = json.loads((tmp_path / "tokenizer.json").read_text())
    assert written.framing.start == ("<|endoftext|>",) and written.framing.end == ()
    # GPT-2's start and end token are one token: only the start is added.
    assert config["add_bos_token"] is True and config["add_eos_token"] is False
    assert config["model_max_length"] == 32
    assert document["padding"]["strategy"] == {"Fixed": 32}
    assert document["truncation"]["max_length"] == 32
    framed = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("Hello world")
    keras = preprocessor.generate_preprocess(["Hello world"])
    assert framed.ids == [int(i) for i in keras["token_ids"][0]]
    assert framed.attention_mask == [int(m) for m in keras["padding_mask"][0]]


def test_a_classifier_preprocessor_frames_pairs_as_keras_hub(tokenizers_made, tmp_path):
    preprocessor = tokenizers_made["bert classifier"]
    export_tokenizer(preprocessor, tmp_path, check=False)
    files = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    first, second = ["The quick fox", "Привет мир"], ["jumps over", "the lazy dog!"]
    # As a keyword: a positional pair would be unpacked as (x, y).
    keras = preprocessor(x=(first, second))
    for index, (a, b) in enumerate(zip(first, second, strict=True)):
        encoding = files.encode(a, b)
        assert encoding.ids == [int(i) for i in keras["token_ids"][index]]
        assert encoding.type_ids[: sum(encoding.attention_mask)] == [
            int(i) for i in keras["segment_ids"][index][: sum(encoding.attention_mask)]
        ]


def test_the_special_tokens_are_written_by_role(tokenizers_made, tmp_path):
    export_tokenizer(tokenizers_made["bert uncased"], tmp_path, check=False)
    roles = json.loads((tmp_path / "special_tokens_map.json").read_text())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert roles == {
        "bos_token": "[CLS]",
        "eos_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
        "unk_token": "[UNK]",
    }
    assert config["tokenizer_class"] == "BertTokenizer" and config["do_lower_case"] is True
    assert config["clean_up_tokenization_spaces"] is False


class _OwnTokenize(keras_hub.tokenizers.BytePairTokenizer):
    def tokenize(self, inputs):
        return super().tokenize(inputs)


class _NoPacker(keras_hub.models.Preprocessor):
    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda v, m: keras_hub.tokenizers.ByteTokenizer(), ["ByteTokenizer", "byte values"]),
        (
            lambda v, m: keras_hub.tokenizers.UnicodeCodepointTokenizer(),
            ["UnicodeCodepointTokenizer", "code points"],
        ),
        (lambda v, m: _OwnTokenize(vocabulary=v, merges=m), ["_OwnTokenize", "overrides tokenize"]),
        (
            lambda v, m: keras_hub.tokenizers.BytePairTokenizer(),
            ["BytePairTokenizer", "no vocabulary"],
        ),
        (
            lambda v, m: keras_hub.tokenizers.WordPieceTokenizer(),
            ["WordPieceTokenizer", "no vocabulary"],
        ),
        (
            lambda v, m: keras_hub.tokenizers.SentencePieceTokenizer(),
            ["SentencePieceTokenizer", "no vocabulary"],
        ),
        (
            lambda v, m: keras_hub.models.GPT2Tokenizer(vocabulary=v, merges=m, sequence_length=8),
            ["GPT2Tokenizer", "sequence_length=8"],
        ),
        (
            lambda v, m: _NoPacker(keras_hub.models.GPT2Tokenizer(vocabulary=v, merges=m)),
            ["_NoPacker", "no `packer`"],
        ),
        (lambda v, m: "not a tokenizer", ["str"]),
    ],
    ids=[
        "byte",
        "codepoint",
        "own tokenize",
        "bpe empty",
        "wordpiece empty",
        "spm empty",
        "own sequence length",
        "no packer",
        "str",
    ],
)
def test_what_cannot_be_written_is_refused_by_name(make, words, byte_level, tmp_path):
    with pytest.raises(UsageError) as raised:
        export_tokenizer(make(*byte_level), tmp_path)
    for word in words:
        assert word in str(raised.value)
    assert not (tmp_path / "tokenizer.json").exists()


def test_keras_hub_still_splits_its_eager_bpe_on_a_literal_string(byte_level):
    # byte_pair.py writes "no split" because keras-hub hands its regex to
    # `pre_tokenizers.Split` as a plain string; if keras-hub fixes that, the
    # converter must follow (write the regex) and this test says so.
    from keras_hub.src.tokenizers import byte_pair_tokenizer

    assert byte_pair_tokenizer.SPLIT_PATTERN_TOKENIZERS == KERAS_HUB_SPLIT_PATTERN
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=byte_level[0], merges=byte_level[1])
    tokenizer.tokenize("warm up")
    split = json.loads(tokenizer._tokenizer.to_str())["pre_tokenizer"]["pretokenizers"][0]
    assert split["pattern"] == {"String": KERAS_HUB_SPLIT_PATTERN}


def test_sentence_piece_merges_rank_splits_by_the_merged_pieces_score():
    pieces = [
        ("<unk>", 0.0, 2),
        ("a", -1.0, NORMAL),
        ("b", -2.0, NORMAL),
        ("c", -3.0, NORMAL),
        ("bc", -4.0, NORMAL),
        ("ab", -5.0, NORMAL),
        ("abc", -4.5, NORMAL),
        ("<s>", 0.0, CONTROL),
    ]
    # "abc" splits as a+bc (ids 1, 4) and ab+c (ids 5, 3): both ranked at its score.
    assert derive_merges(pieces) == [["b", "c"], ["a", "bc"], ["ab", "c"], ["a", "b"]]
    assert BPE == 2


# --- Proving the proof: broken files are caught ----------------------------------------


def _break(folder, change) -> None:
    path = folder / "tokenizer.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    change(document)
    path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")


def _swap_first_two_ids(tokenizer, text):
    """A change to the written document that swaps the first two ids `text` encodes to."""
    ids = _keras_ids(tokenizer, text)
    first, second = ids[0], next(i for i in ids if i != ids[0])
    tokens = tokenizer.id_to_token(first), tokenizer.id_to_token(second)

    def swap(document):
        vocabulary = document["model"]["vocab"]
        vocabulary[tokens[0]], vocabulary[tokens[1]] = second, first

    return swap, (first, second)


def test_two_swapped_ids_are_caught_by_both_readers(tokenizers_made, tmp_path):
    gpt2 = tokenizers_made["gpt2"]
    export_tokenizer(gpt2, tmp_path, check=False)
    text = STRESS_CORPUS[0]
    swap, (first, second) = _swap_first_two_ids(gpt2, text)
    _break(tmp_path, swap)
    report = check_identity(gpt2, tmp_path)
    swapped = {first: second, second: first}
    for name in ("tokenizers", EXTENSIONS):
        found = report.reader(name).first
        assert (found.check, found.text) == ("encode", text), report.summary()
        assert found.reader == [swapped.get(i, i) for i in found.keras]
    assert not report.identical
    assert repr(text) in report.summary()
    plain = json.loads(json.dumps(report.report()))
    assert plain["readers"][0]["differences"][0]["text"] == text


def test_a_dropped_merge_is_caught(tokenizers_made, tmp_path):
    llama = tokenizers_made["llama bpe"]
    export_tokenizer(llama, tmp_path, check=False)
    text = STRESS_CORPUS[0]
    longest = max(_keras_ids(llama, text), key=lambda i: len(llama.id_to_token(i)))
    piece = llama.id_to_token(longest)

    def drop(document):
        merges = document["model"]["merges"]
        document["model"]["merges"] = [m for m in merges if "".join(m) != piece]

    _break(tmp_path, drop)
    found = check_identity(llama, tmp_path).reader("tokenizers").first
    assert (found.check, found.text) == ("encode", text)
    assert longest in found.keras and longest not in found.reader


def test_lowercasing_removed_is_caught(tokenizers_made, tmp_path):
    bert = tokenizers_made["bert uncased"]
    export_tokenizer(bert, tmp_path, check=False)
    _break(tmp_path, lambda document: document.update(normalizer=None))
    found = check_identity(bert, tmp_path).reader("tokenizers").first
    # The first text with a capital letter is the first that differs.
    assert (found.check, found.text) == ("encode", STRESS_CORPUS[0])
    assert found.keras != found.reader


def test_the_gate_refuses_a_wrong_file_with_the_text_and_both_ids(
    tokenizers_made, tmp_path, monkeypatch
):
    gpt2 = tokenizers_made["gpt2"]
    text = STRESS_CORPUS[0]
    swap, (first, second) = _swap_first_two_ids(gpt2, text)

    write = gate.write_tokenizer

    def write_broken(given, folder):
        written = write(given, folder)
        _break(folder, swap)
        return written

    monkeypatch.setattr(gate, "write_tokenizer", write_broken)
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("the user's file")
    with pytest.raises(ValidationFailed) as raised:
        export_tokenizer(gpt2, folder)
    message = str(raised.value)
    keras = _keras_ids(gpt2, text)
    swapped = [{first: second, second: first}.get(i, i) for i in keras]
    assert repr(text) in message and str(keras) in message and str(swapped) in message
    assert "Nothing was placed" in message
    # Nothing placed, nothing lost: the folder is as it was.
    assert [p.name for p in folder.iterdir()] == ["tokenizer.json"]
    assert (folder / "tokenizer.json").read_text() == "the user's file"
    identity = raised.value.report["tokenizer"]["identity"]
    assert identity["passed"] is False and identity["readers"][0]["unexplained"]


def test_a_known_gap_is_not_a_failure_but_the_same_reader_elsewhere_is(tokenizers_made, tmp_path):
    # onnxruntime-extensions reads C strings (a known gap for byte-level BPE):
    # its differences on texts with U+0000 pass; one on any other text fails.
    gpt2 = tokenizers_made["gpt2"]
    nul_texts = [text for text in STRESS_CORPUS if "\x00" in text]
    assert nul_texts, "the stress corpus must hold a U+0000"
    written = export_tokenizer(gpt2, tmp_path / "ok", corpus=nul_texts)
    extensions = written.identity.reader(EXTENSIONS)
    assert extensions.differences and not extensions.unexplained and extensions.passed

    text = STRESS_CORPUS[0]
    swap, _ = _swap_first_two_ids(gpt2, text)
    export_tokenizer(gpt2, tmp_path / "broken", check=False)
    _break(tmp_path / "broken", swap)
    report = check_identity(gpt2, tmp_path / "broken", corpus=[text, *nul_texts])
    assert not report.passed
    assert {d.text for d in report.reader(EXTENSIONS).unexplained} == {text}


def test_the_gate_places_the_files_and_leaves_the_rest_of_the_folder(tokenizers_made, tmp_path):
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"not touched")
    (folder / "tokenizer.json").write_text("an older export")
    written = export_tokenizer(tokenizers_made["gpt2"], folder, corpus=STRESS_CORPUS[:3])
    assert written.identity.passed and written.identity.folder == folder
    assert sorted(p.name for p in folder.iterdir()) == sorted(["model.onnx", *FILES])
    assert (folder / "model.onnx").read_bytes() == b"not touched"
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["type"] == "BPE"


def test_a_folder_that_is_a_file_is_refused_before_any_work(tokenizers_made, tmp_path):
    (tmp_path / "file").write_text("mine")
    for folder in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(OutputError, match="is a file, not a folder"):
            export_tokenizer(tokenizers_made["gpt2"], folder)
    assert (tmp_path / "file").read_text() == "mine"
    with pytest.raises(UsageError, match="give the path of a folder"):
        export_tokenizer(tokenizers_made["gpt2"], None)
