"""`generate` checks every argument before any work, and refuses what it cannot honour.

Each argument is refused with a `ValueError` or a `TypeError` whose one-line
message names it (`argument=value: why; what to do`), before a token is
generated: ids outside the vocabulary or of a float, bool or string type,
masks of strings or NaN or with holes, counts past the model's positions or
the memory available, and samplers' numbers of the wrong type or range. One
tiny GPT-2 of 12 positions is exported once for the module; the property test
drives `generate` with random arguments, valid and not, and asserts it returns
the tokens its docstring promises or raises one of those two errors, never
anything else. The default suite runs the `fast` hypothesis profile;
`HYPOTHESIS_PROFILE=thorough python -m pytest tests/test_generate_arguments.py`
runs 2,000 cases (tests/conftest.py).
"""

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_layers.export import export_model, generate, memory
from keras_layers.export.decoding import ArgumentTypeError
from keras_layers.export.generation import CachedDecoder
from tests import zoo_models

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.xdist_group("generate_arguments"),  # module fixtures: one worker (loadgroup)
]

VOCAB = 50
POSITIONS = 12
ARGUMENTS = (
    "onnx_path",
    "token_ids",
    "max_new_tokens",
    "padding_mask",
    "sampler",
    "seed",
    "end_token_id",
    "top_k",
    "top_p",
    "temperature",
    "pad_token_id",
)


def tiny_gpt2():
    """A GPT-2 of one layer, 50 tokens and 12 positions, every float weight redrawn."""
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=POSITIONS,
    )
    return zoo_models.redraw(keras_hub.models.GPT2CausalLM(backbone, preprocessor=None), 0)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    output = tmp_path_factory.mktemp("tiny") / "gpt2.onnx"
    assert export_model(tiny_gpt2(), output, task="causal-lm")["passed"]
    return output


@pytest.fixture(scope="module")
def decoder(path):
    return CachedDecoder(path)


IDS = np.array([[5, 6, 7], [8, 9, 0]])
MASK = np.array([[1, 1, 1], [1, 1, 0]], bool)


def run(decoder, **change):
    """`generate` on two prompts (3 and 2 tokens), `change` applied; ids of
    another shape come without the mask."""
    mask = MASK if "token_ids" not in change else None
    arguments = {"token_ids": IDS, "max_new_tokens": 3, "padding_mask": mask} | change
    return generate(arguments.pop("onnx_path", decoder), **arguments)


# Each reproduction of issue #28 (items 4 and 6): the error, and what the
# message must say (the argument as the Python API spells it, and the value).
REFUSED = {
    "id -1 (Gather wraps it)": ({"token_ids": [[1, -1, 3]]}, ValueError, "token_ids[0, 1]=-1"),
    "id 2**32+5 (taken as 5)": ({"token_ids": [[2**32 + 5]]}, ValueError, "token_ids[0, 0]="),
    "id 2**64-1 in uint64": (
        {"token_ids": np.array([[2**64 - 1]], np.uint64)},
        ValueError,
        "token_ids[0, 0]=18446744073709551615 is outside the vocabulary [0, 50)",
    ),
    "id at the vocabulary": ({"token_ids": [[VOCAB]]}, ValueError, "token_ids[0, 0]=50"),
    "bool ids": ({"token_ids": [[True, False]]}, TypeError, "token_ids of dtype bool"),
    "float ids": ({"token_ids": [[1.0, 2.0]]}, TypeError, "token_ids of dtype float64"),
    "string ids": ({"token_ids": [["1", "2"]]}, TypeError, "token_ids of dtype <U1"),
    "object ids": ({"token_ids": [[2**70]]}, TypeError, "token_ids of dtype object"),
    "ragged ids": ({"token_ids": [[1, 2], [3]]}, TypeError, "token_ids="),
    "3-D ids": ({"token_ids": np.ones((1, 2, 2), int)}, ValueError, "token_ids of shape"),
    "batch 0": ({"token_ids": np.zeros((0, 3), int)}, ValueError, "token_ids of shape (0, 3)"),
    "prompt length 0": ({"token_ids": [[]]}, ValueError, "token_ids of shape (1, 0)"),
    "string mask": ({"padding_mask": [["a"] * 3] * 2}, TypeError, "padding_mask of dtype"),
    "NaN mask": (
        {"padding_mask": [[1, np.nan, 1], [1, 1, 0]]},
        ValueError,
        "padding_mask[0, 1]=nan",
    ),
    "mask of 2s": ({"padding_mask": [[1, 2, 1], [1, 1, 0]]}, ValueError, "padding_mask[0, 1]=2"),
    "mask with a hole": (
        {"padding_mask": [[1, 0, 1], [1, 1, 0]]},
        ValueError,
        "padding_mask[0] is not right padding",
    ),
    "mask of an empty row": (
        {"padding_mask": [[1, 1, 1], [0, 0, 0]]},
        ValueError,
        "padding_mask[1] marks no token",
    ),
    "mask of another shape": ({"padding_mask": [[1, 1]]}, ValueError, "padding_mask of shape"),
    "end_token_id 'x'": ({"end_token_id": "x"}, TypeError, "end_token_id='x'"),
    "end_token_id outside": ({"end_token_id": VOCAB}, ValueError, "end_token_id=50"),
    "pad_token_id 1.5": ({"pad_token_id": 1.5}, TypeError, "pad_token_id=1.5"),
    "pad_token_id -1": ({"pad_token_id": -1}, ValueError, "pad_token_id=-1"),
    "pad_token_id None": ({"pad_token_id": None}, TypeError, "pad_token_id=None"),
    "max_new_tokens past the positions": (
        {"max_new_tokens": 11},
        ValueError,
        "max_new_tokens=11: the longest prompt (3 tokens)",
    ),
    "prompt past the positions": (
        {"token_ids": np.ones((1, 13), int), "padding_mask": None},
        ValueError,
        "the longest prompt holds 13 tokens and the model runs at most 12 positions",
    ),
    "max_new_tokens 10**9": ({"max_new_tokens": 10**9}, ValueError, "GB are available"),
    "max_new_tokens 0": ({"max_new_tokens": 0}, ValueError, "max_new_tokens=0"),
    "max_new_tokens True": ({"max_new_tokens": True}, TypeError, "max_new_tokens=True"),
    "max_new_tokens 2.0": ({"max_new_tokens": 2.0}, TypeError, "max_new_tokens=2.0"),
    "sampler 'beam'": ({"sampler": "beam"}, ValueError, "sampler='beam'"),
    "sampler None": ({"sampler": None}, TypeError, "sampler=None"),
    "top_k 0": ({"top_k": 0}, ValueError, "top_k=0"),
    "top_k True": ({"top_k": True}, TypeError, "top_k=True"),
    "top_p string": ({"top_p": "0.5"}, TypeError, "top_p='0.5'"),
    "top_p NaN": ({"top_p": float("nan")}, ValueError, "top_p=nan"),
    "top_p 1.5": ({"top_p": 1.5}, ValueError, "top_p=1.5"),
    "temperature string": ({"temperature": "1"}, TypeError, "temperature='1'"),
    "temperature inf": ({"temperature": float("inf")}, ValueError, "temperature=inf"),
    "temperature 0": ({"temperature": 0}, ValueError, "temperature=0"),
    "temperature True": ({"temperature": True}, TypeError, "temperature=True"),
    "seed -1": ({"seed": -1}, ValueError, "seed=-1"),
    "seed string": ({"seed": "s"}, TypeError, "seed='s'"),
    "onnx_path None": ({"onnx_path": None}, TypeError, "onnx_path=None"),
}


@pytest.mark.parametrize("change, error, message", REFUSED.values(), ids=REFUSED.keys())
def test_each_bad_argument_is_refused_naming_it(decoder, change, error, message):
    with pytest.raises(error) as caught:
        run(decoder, **change)
    text = str(caught.value)
    assert message in text
    assert "\n" not in text


def test_a_type_error_is_a_value_error_too(decoder):
    """Code that caught `ValueError` for every bad argument keeps working."""
    with pytest.raises(ArgumentTypeError) as caught:
        run(decoder, max_new_tokens=2.0)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)


def test_the_longest_request_that_fits_the_positions_runs(decoder):
    """The last new token is never fed back: a 3-token prompt and 10 new
    tokens feed 12 positions, the model's all; one more is refused, naming
    the most it can take."""
    tokens = run(decoder, max_new_tokens=10)
    assert tokens.shape == (2, 13)
    with pytest.raises(ValueError, match="ask for at most max_new_tokens=10"):
        run(decoder, max_new_tokens=11)


def test_nothing_is_generated_before_a_late_argument_is_refused(decoder, monkeypatch):
    """The checks run before the first call of the file."""
    calls = []
    monkeypatch.setattr(decoder, "step", lambda *args: calls.append(args))
    for change in ({"max_new_tokens": 11}, {"pad_token_id": -1}, {"max_new_tokens": 10**9}):
        with pytest.raises(ValueError):
            run(decoder, **change)
    assert calls == []


def test_memory_is_refused_with_both_figures(decoder, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 1_000)
    with pytest.raises(ValueError) as caught:
        run(decoder, max_new_tokens=4)
    assert "max_new_tokens=4 with token_ids of shape (2, 3): generating needs at least" in str(
        caught.value
    )
    assert "and 0.0 MB are available" in str(caught.value)


def test_masks_of_zeros_and_ones_are_taken_as_booleans(decoder):
    expected = run(decoder)
    for mask in (MASK.astype("int8"), MASK.astype("float32"), MASK.tolist()):
        np.testing.assert_array_equal(run(decoder, padding_mask=mask), expected)


def test_ids_of_any_integer_type_give_the_same_tokens_in_the_models_type(decoder):
    expected = run(decoder)
    assert expected.dtype == decoder.ids_dtype
    for dtype in ("uint8", "int16", "uint32", "int64", "uint64"):
        tokens = run(decoder, token_ids=IDS.astype(dtype), padding_mask=MASK)
        np.testing.assert_array_equal(tokens, expected)


def test_the_vocabulary_comes_from_the_logits_shape(decoder):
    assert decoder.vocabulary == VOCAB


def test_the_file_is_asked_for_its_positions(decoder):
    assert decoder.longest_sequence(100) == POSITIONS
    assert decoder.longest_sequence(5) == 5
    assert "ONNX" in decoder.failure or "Reshape" in decoder.failure


# The property: random arguments, valid and not.
INTEGER_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
ID_VALUES = st.integers(0, VOCAB - 1) | st.sampled_from([-1, VOCAB, 2**31, 2**32 + 5, 2**63 - 1])
SHAPES = st.sampled_from([(1, 3), (2, 4), (3, 2), (1, 1), (2, 12), (1, 13), (0, 3), (2, 0)])
SHAPES |= st.sampled_from([(), (3,), (1, 2, 2)])


@st.composite
def token_ids(draw):
    shape = draw(SHAPES)
    size = int(np.prod(shape))
    values = np.array(draw(st.lists(ID_VALUES, min_size=size, max_size=size)), np.int64)
    values = values.reshape(shape)
    kind = draw(st.sampled_from([*INTEGER_DTYPES, "bool", "float", "str", "object", "list"]))
    if kind == "float":
        return values.astype("float64")
    if kind == "str":
        return values.astype(str)
    if kind == "object":
        return values.astype(object)
    if kind == "list":
        return values.tolist()
    return values.astype(kind)  # integers wrap, as a caller's cast would


@st.composite
def masks(draw, ids):
    shape = np.shape(ids)
    if draw(st.booleans()) or len(shape) != 2:
        return None
    if draw(st.integers(0, 4)) == 0:  # of another shape
        shape = (shape[0], shape[1] + 1)
    lengths = draw(st.lists(st.integers(0, shape[1]), min_size=shape[0], max_size=shape[0]))
    mask = np.arange(shape[1]) < np.array(lengths, int).reshape(-1, 1)
    if mask.size and draw(st.integers(0, 4)) == 0:  # a hole or a stray token
        row, column = draw(st.integers(0, shape[0] - 1)), draw(st.integers(0, shape[1] - 1))
        mask[row, column] = not mask[row, column]
    kind = draw(st.sampled_from(["bool", "int", "float", "odd", "nan", "str"]))
    if kind in ("bool", "int", "float"):
        return mask.astype(kind)
    if kind == "str":
        return mask.astype(str)
    odd = mask.astype("float64")
    if odd.size:
        odd.flat[draw(st.integers(0, odd.size - 1))] = np.nan if kind == "nan" else 0.5
    return odd


@st.composite
def valid_arguments(draw):
    """Arguments `generate` takes: prompts that fit the model's positions."""
    batch, length = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    lengths = np.array(draw(st.lists(st.integers(1, length), min_size=batch, max_size=batch)))
    mask = np.arange(length) < lengths[:, None]
    ids = np.array(
        draw(st.lists(st.integers(0, VOCAB - 1), min_size=mask.size, max_size=mask.size))
    )
    ids = ids.reshape(mask.shape).astype(draw(st.sampled_from(INTEGER_DTYPES)))
    return {
        "token_ids": ids if draw(st.booleans()) else ids.tolist(),
        "max_new_tokens": draw(st.integers(1, POSITIONS - int(lengths.max()) + 1)),
        "padding_mask": draw(st.sampled_from([None, mask, mask.astype(int), mask.astype(float)])),
        "sampler": draw(st.sampled_from(["greedy", "top_k", "top_p"])),
        "seed": draw(st.none() | st.integers(0, 9)),
        "end_token_id": draw(st.none() | st.integers(0, VOCAB - 1)),
        "top_k": draw(st.integers(1, VOCAB + 5)),
        "top_p": draw(st.floats(0.05, 1.0)),
        "temperature": draw(st.floats(0.1, 5.0)),
        "pad_token_id": draw(st.integers(0, VOCAB - 1)),
    }


NUMBERS = st.sampled_from([float("nan"), float("inf"), -1.0, 0, True, "1", None, 10**400])
TOKEN_IDS = st.none() | st.integers(-2, VOCAB + 1) | st.sampled_from(["x", 1.5, True, 2**64])
ANY = {  # any value of each argument, valid or not (the mask's depends on the ids)
    "token_ids": token_ids(),
    "max_new_tokens": st.integers(0, 13) | st.sampled_from([-1, 10**9, 2**40, True, 2.0, "3"]),
    "sampler": st.sampled_from(["beam", "", "GREEDY", 3, None, b"greedy"]),
    "seed": st.integers(-2, 2) | st.sampled_from(["s", 1.5, True]),
    "end_token_id": TOKEN_IDS,
    "top_k": st.integers(-1, 2) | st.sampled_from([True, 2.5, "5", 10**30]),
    "top_p": st.floats() | NUMBERS,
    "temperature": st.floats() | NUMBERS,
    "pad_token_id": TOKEN_IDS,
}


@pytest.mark.fuzz
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_arguments_give_tokens_or_a_named_error(decoder, path, data):
    """Valid arguments with none, one or two of them replaced by any value."""
    arguments = data.draw(valid_arguments(), "valid arguments")
    arguments["onnx_path"] = data.draw(st.sampled_from([decoder, str(path)]), "onnx_path")
    names = st.sampled_from([*ANY, "padding_mask"])
    count = data.draw(st.integers(0, 2), "arguments replaced")
    for name in data.draw(st.lists(names, min_size=count, max_size=count, unique=True)):
        value = masks(arguments["token_ids"]) if name == "padding_mask" else ANY[name]
        arguments[name] = data.draw(value, name)
    try:
        tokens = generate(**arguments)
    except (ValueError, TypeError) as error:
        text = str(error)
        assert text and "\n" not in text, text
        assert any(name in text for name in ARGUMENTS), text
        return
    ids = np.asarray(arguments["token_ids"])
    batch, length = ids.shape
    assert tokens.shape == (batch, length + arguments["max_new_tokens"])
    assert tokens.dtype == decoder.ids_dtype
    assert tokens.min() >= 0 and tokens.max() < VOCAB
    mask = arguments["padding_mask"]
    lengths = np.full(batch, length) if mask is None else np.asarray(mask).astype(bool).sum(1)
    for row, prompt in enumerate(lengths):
        np.testing.assert_array_equal(tokens[row, :prompt], ids[row, :prompt])
