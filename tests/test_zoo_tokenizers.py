"""The tokenizer of every keras-hub text model of the zoo, exported and proved token-identical.

tests/zoo_tokenizers.py enumerates the tokenizer classes of the zoo's models
(each task's `preprocessor_cls.tokenizer_cls`) and builds each with a
vocabulary trained here, the special tokens it requires read off the class.
Each is exported with `export_tokenizer`, whose gate runs the stress corpus
through keras-hub and both readers (`tokenizers` and onnxruntime-extensions).
A reader must be identical, or differ only where a gap the converter lists
for it explains the difference (each gap is a test on one difference, in
tokenizer_files/gaps.py); an unexplained difference fails the export.
The classes `export_tokenizer` refuses (`REFUSED`) must be refused with a
UsageError naming the class and the reason.

The default suite runs one class per family (`representatives`); `-m zoo`
runs them all.

The same for the zoo tasks' preprocessors (every text-only one whose
tokenizer exports): exported with their framing, the gate compares the framed
ids and padding mask with keras-hub's on the stress corpus; the ones that
cannot be framed in one tokenizer.json (sequence-to-sequence, text with
images) must be refused by name.
"""

import pytest
import zoo_tokenizers

from keras_layers.export.errors import UsageError
from keras_layers.export.tokenizer_files import STRESS_CORPUS, export_tokenizer

ENTRIES = zoo_tokenizers.enumerate_tokenizers()
FAST = set(zoo_tokenizers.representatives().values())
FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}


def _params(names):
    return [
        pytest.param(name, id=name, marks=() if name in FAST else pytest.mark.zoo) for name in names
    ]


EXPORTED = [entry.name for entry in ENTRIES if entry.name not in zoo_tokenizers.REFUSED]


def test_the_enumeration_covers_every_family_and_every_task_with_a_tokenizer():
    families = {entry.family for entry in ENTRIES}
    assert {"BytePairTokenizer", "SentencePieceTokenizer", "WordPieceTokenizer"} <= families
    served = {model for entry in ENTRIES for model in entry.models}
    for model in zoo_tokenizers.zoo_models.candidates():
        tokenizer = zoo_tokenizers._task_tokenizer(model.cls)
        if model.kind != "backbone" and tokenizer is not None:
            assert model.name in served, model.name
    assert set(zoo_tokenizers.REFUSED) <= {entry.name for entry in ENTRIES}


@pytest.mark.parametrize("name", _params(EXPORTED))
def test_the_tokenizer_exports_and_is_token_identical_but_for_its_known_gaps(name, tmp_path):
    tokenizer = zoo_tokenizers.build(name)
    written = export_tokenizer(tokenizer, tmp_path)  # fails on an unexplained difference
    assert {path.name for path in written.files} == FILES
    assert written.keras_class == name
    report = written.identity
    assert report.passed, report.summary()
    assert [result.reader for result in report.readers] == ["tokenizers", "onnxruntime-extensions"]
    for result in report.readers:
        assert result.error is None, result.error
        assert result.compared >= len(STRESS_CORPUS), result.summary()
        assert result.known_gaps == written.known_gaps.get(result.reader, ())
        # A reader that differs anywhere was expected to, and says why.
        assert result.identical or result.known_gaps, result.summary()
        assert result.measured_only or result.unexplained == (), result.reader


@pytest.mark.parametrize("name", _params(sorted(zoo_tokenizers.REFUSED)))
def test_a_refused_tokenizer_is_refused_by_name_with_the_reason(name, tmp_path):
    with pytest.raises(UsageError) as raised:
        export_tokenizer(zoo_tokenizers.instance(name), tmp_path)
    words, _ = zoo_tokenizers.REFUSED[name]
    assert name in str(raised.value) and words in str(raised.value)
    assert not (tmp_path / "tokenizer.json").exists()


PREPROCESSORS = [entry.name for entry in zoo_tokenizers.enumerate_preprocessors()]
# One per way of framing in the default suite: a causal LM's StartEndPacker, a
# causal LM's MultiSegmentPacker, a classifier's pairs, a masked LM's packer.
FAST_PREPROCESSORS = {
    "GPT2CausalLMPreprocessor",
    "Gemma3CausalLMPreprocessor",
    "BertTextClassifierPreprocessor",
    "RobertaMaskedLMPreprocessor",
}


def test_the_preprocessors_are_enumerated_and_the_refusals_are_among_them():
    assert len(PREPROCESSORS) >= 30
    assert FAST_PREPROCESSORS <= set(PREPROCESSORS)
    assert set(zoo_tokenizers.PREPROCESSOR_REFUSED) <= set(PREPROCESSORS)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, id=name, marks=() if name in FAST_PREPROCESSORS else pytest.mark.zoo)
        for name in PREPROCESSORS
        if name not in zoo_tokenizers.PREPROCESSOR_REFUSED
    ],
)
def test_the_preprocessor_exports_with_its_framing_and_frames_as_keras_hub(name, tmp_path):
    preprocessor = zoo_tokenizers.build_preprocessor(name)
    written = export_tokenizer(preprocessor, tmp_path)  # the gate compares the framed ids
    report = written.identity
    assert report.passed, report.summary()
    assert written.framing is not None and written.framing.source.startswith(name)
    assert written.framing.sequence_length == zoo_tokenizers.SEQUENCE_LENGTH
    library = report.reader("tokenizers")
    # Three checks per text: encode, decode, and the framed ids with their mask.
    assert library.compared == 3 * len(STRESS_CORPUS), library.summary()


@pytest.mark.zoo
@pytest.mark.parametrize("name", sorted(zoo_tokenizers.PREPROCESSOR_REFUSED))
def test_a_preprocessor_that_cannot_be_framed_is_refused_by_name(name, tmp_path):
    with pytest.raises(UsageError) as raised:
        export_tokenizer(zoo_tokenizers.build_preprocessor(name), tmp_path)
    assert name in str(raised.value)
    assert zoo_tokenizers.PREPROCESSOR_REFUSED[name] in str(raised.value)
    assert list(tmp_path.iterdir()) == []
