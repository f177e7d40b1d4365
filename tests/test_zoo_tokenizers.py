"""The tokenizer of every keras-hub text model of the zoo, exported and proved token-identical.

tests/zoo_tokenizers.py enumerates the tokenizer classes of the zoo's models
(each task's `preprocessor_cls.tokenizer_cls`) and builds each with a
vocabulary trained here, the special tokens it requires read off the class.
Each is exported with `export_tokenizer`, and `check_identity` runs the stress
corpus through keras-hub and both readers (`tokenizers` and
onnxruntime-extensions). A reader must be identical, or differ only where a
gap `check_identity` lists for it explains the difference (each gap is a test
on one difference, in zoo_tokenizers.py); an unexplained difference fails.
The classes `export_tokenizer` refuses (`REFUSED`) must be refused with a
UsageError naming the class and the reason.

The default suite runs one class per family (`representatives`); `-m zoo`
runs them all.
"""

import pytest
import zoo_tokenizers

from keras_layers.export.errors import UsageError
from keras_layers.export.tokenizer_files import STRESS_CORPUS, check_identity, export_tokenizer

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
    written = export_tokenizer(tokenizer, tmp_path)
    assert {path.name for path in written.files} == FILES
    assert written.keras_class == name
    report = check_identity(tokenizer, tmp_path)
    assert [result.reader for result in report.readers] == ["tokenizers", "onnxruntime-extensions"]
    for result in report.readers:
        assert result.error is None, result.error
        assert result.compared >= len(STRESS_CORPUS), result.summary()
        assert result.known_gaps == written.known_gaps.get(result.reader, ())
        # A reader that differs anywhere was expected to, and says why.
        assert result.identical or result.known_gaps, result.summary()
        if zoo_tokenizers.measured_only(result.known_gaps):
            continue
        assert zoo_tokenizers.unexplained(result, tokenizer) == [], result.reader


@pytest.mark.parametrize("name", _params(sorted(zoo_tokenizers.REFUSED)))
def test_a_refused_tokenizer_is_refused_by_name_with_the_reason(name, tmp_path):
    with pytest.raises(UsageError) as raised:
        export_tokenizer(zoo_tokenizers.instance(name), tmp_path)
    words, _ = zoo_tokenizers.REFUSED[name]
    assert name in str(raised.value) and words in str(raised.value)
    assert not (tmp_path / "tokenizer.json").exists()
