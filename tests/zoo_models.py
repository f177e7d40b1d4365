"""Every keras-hub text model, built tiny and offline: the models of the zoo tier.

Shared by tests/test_zoo.py and benchmarks/zoo.py, so the tests and the page's
table are about the same models.

Enumeration (programmatic, never a hand-picked list):

- backbones: every class in `keras_hub.models` that subclasses
  `keras_hub.models.Backbone`;
- tasks: every class there that subclasses `CausalLM`, `MaskedLM`,
  `TextClassifier` or `Seq2SeqLM`, built on its `backbone_cls` with
  `preprocessor=None`.

Aliases (`BertClassifier` is `BertTextClassifier`) count once, under the
class's own name.

Which are text models, in two steps:

1. before building: the class's `__init__` takes a vocabulary size
   (`vocabulary_size`, `vocab_size`, `text_vocab_size`) and no pre-built
   sub-model (`image_encoder`, `vision_encoder`, `text_encoder`, ...) without
   a default. A backbone without a vocabulary reads pixels or audio; one that
   needs a sub-model handed in is a composite (CLIP, SAM, BLIP-2, PARSeq). A
   task is a candidate when its backbone is;
2. after building: every input of the backbone is an integer tensor and one of
   them is `token_ids` or `encoder_token_ids`. A float input means images,
   video or audio features (PaliGemma, Whisper, Moonshine, VideoPrism).

A class that fails either step is skipped, and `skip_reason` says why.

Sizes are read off each class's `__init__` signature and filled from `TINY`
(by argument name, after dropping an `encoder_`/`decoder_`/`text_`/`vit_`
prefix or an `_enc`/`_dec` suffix); `EXTRA` holds the few values that are not a
size (layer-type lists, LoRA ranks). Nothing is downloaded: no `from_preset`.
Every float weight is then drawn anew from N(0, 0.2) with a fixed seed,
because keras-hub's initialisers can make kernels identical (zero biases, equal
query and key projections), which would hide swapped inputs or a lost mask.
"""

import inspect
import re
from dataclasses import dataclass, field

import numpy as np

VOCAB = 64
SEED = 0

TASK_BASES = ("Seq2SeqLM", "MaskedLM", "TextClassifier", "CausalLM")  # most specific first

# Tiny values by (normalised) argument name. A required argument gets its value;
# an optional one only when its default is an int, i.e. a size to shrink (an
# optional `None` switches a feature on or off and is left alone).
TINY = {
    "vocabulary_size": VOCAB,
    "vocab_size": VOCAB,
    "num_layers": 2,  # two, so whatever alternates between layers is exercised
    "num_hidden_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 2,
    "num_query_heads": 2,
    "num_attention_heads": 2,
    "num_decoder_heads": 2,
    "num_key_value_heads": 1,  # grouped-query attention where the model has it
    "hidden_dim": 16,
    "hidden_size": 16,
    "embedding_dim": 16,
    "intermediate_dim": 32,
    "intermediate_size": 32,
    "moe_intermediate_dim": 32,
    "shared_expert_intermediate_dim": 32,
    "shared_expert_intermediate_size": 32,
    "head_dim": 8,
    "head_size": 8,
    "max_sequence_length": 32,
    "max_position_embeddings": 32,
    # Short windows, so the validation grid's 64 and 256 tokens cross them.
    "sliding_window_size": 16,
    "sliding_window": 16,
    "num_experts": 4,
    "top_k": 2,
    "num_classes": 3,
    # Sizes of image/audio parts, only so that multimodal backbones build and
    # step 2 can read their inputs.
    "image_size": 16,
    "patch_size": 4,
    "num_frames": 2,
    "filter_dim": 16,
}
_PREFIX = re.compile(r"^(encoder|decoder|text|vit)_")
_SUFFIX = re.compile(r"_(enc|dec)$")
VOCABULARY_ARGUMENTS = ("vocabulary_size", "vocab_size", "text_vocab_size")
SUB_MODEL_ARGUMENTS = re.compile(
    r"(image|vision|text|audio)_encoder|qformer|language_model|backbone|prompt_encoder"
    r"|mask_decoder|vae|clip_[lg]"
)

# Values that are not sizes, per class, each from the class's docstring example.
EXTRA = {
    # Every layer a sliding and a full-attention layer, as the presets alternate.
    "T5GemmaBackbone": {
        "encoder_layer_types": ["sliding_attention", "full_attention"],
        "decoder_layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 16,  # optional, None by default, but sliding layers need it
    },
    "T5Gemma2Backbone": {
        "encoder_layer_types": ["sliding_attention", "full_attention"],
        "decoder_layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 16,
    },
    # SmolLM3 leaves RoPE out of some layers (NoPE): one of each.
    "SmolLM3Backbone": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_layer_enabled_list": [True, False],
        "layer_types": ["attention", "attention"],
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-6,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 1.0,
    },
    "Gemma3nBackbone": {
        "pad_token_id": 0,
        "intermediate_size": [32, 32],
        "hidden_activation": "gelu_approximate",
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_theta": 10000.0,
        "vocab_size_per_layer_input": VOCAB,
        "hidden_size_per_layer_input": 2,
        "altup_num_inputs": 2,
        "laurel_rank": 1,
    },
    # The defaults (16 key heads x 128) would be 50x the rest of the model.
    "Qwen3_5Backbone": {
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
    },
    "Qwen3_5MoeBackbone": {
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "shared_expert_intermediate_size": 32,
    },
    "RWKV7Backbone": {"gate_lora": 8, "mv_lora": 8, "aaa_lora": 8, "decay_lora": 8},
    "VideoPrismBackbone": {
        "num_spatial_layers": 1,
        "num_temporal_layers": 1,
        "num_auxiliary_layers": 1,
        "image_shape": (16, 16, 3),
    },
    # The speculative-decoding drafter: its functional graph is the backbone and
    # the tied output; 64 tokens over 4 centroids.
    "Gemma4AssistantCausalLM": {
        "backbone_hidden_size": 16,
        "num_centroids": 4,
        "centroid_intermediate_top_k": 2,
        "use_ordered_embeddings": False,
    },
}

# Models whose export fails with the default flags, and why. Each reason names
# the error and exit status the export gives, and tests/test_zoo.py asserts
# exactly that. "pipeline bug:" entries are defects of the export pipeline (the
# model is exportable in principle), listed so the tests stay truthful until
# they are fixed; then the test fails, and the entry goes.
UNSUPPORTED: dict[str, str] = {
    "Gemma4AssistantCausalLM": (
        "UsageError (exit 2): a speculative-decoding drafter; Keras itself refuses to call it "
        "without its target model (NotImplementedError), so there is no standalone graph"
    ),
}


# The classes step 2 of the text rule skips: they pass step 1 (a vocabulary,
# no sub-model required) but, built, read a float input. Step 2 needs every
# text backbone built (about 20 s), too slow for the tests' collection, so the
# outcome is kept here; tests/test_zoo_vision.py's
# `test_reads_media_is_what_the_text_rule_skips_once_built` (zoo tier) builds
# them and fails when keras-hub adds or changes one.
READS_MEDIA = ("MoonshineBackbone", "PaliGemmaBackbone", "VideoPrismBackbone", "WhisperBackbone")


class NotATextModel(Exception):
    """Step 2 of the rule: the built backbone reads something besides tokens."""


class NoTinyConfig(Exception):
    """A required constructor argument has no tiny value here."""


@dataclass(frozen=True)
class ZooModel:
    """One enumerated class: `kind` is `backbone` or the task base it subclasses."""

    name: str
    kind: str
    backbone: str  # the backbone class's name (itself, for a backbone)
    skip_reason: str | None = None  # step 1 of the rule, decided before building
    cls: type = field(default=None, repr=False, compare=False)


def _keras_hub():
    import keras_hub

    return keras_hub


def _public_classes() -> list:
    models = _keras_hub().models
    found = {}
    for attribute in sorted(dir(models)):
        value = getattr(models, attribute)
        if inspect.isclass(value):
            found.setdefault(value, attribute)
    return list(found)


def _parameters(cls) -> list:
    return [
        parameter
        for parameter in list(inspect.signature(cls.__init__).parameters.values())[1:]
        if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]


def _step_one(cls) -> str | None:
    """Why `cls` is not a text-model candidate (step 1), or None."""
    parameters = _parameters(cls)
    needed = [
        parameter.name
        for parameter in parameters
        if parameter.default is inspect.Parameter.empty
        and SUB_MODEL_ARGUMENTS.fullmatch(parameter.name)
    ]
    if needed:  # said first: the more specific reason
        return f"needs a pre-built sub-model ({', '.join(needed)}): a composite"
    if not {parameter.name for parameter in parameters} & set(VOCABULARY_ARGUMENTS):
        return "no vocabulary argument: an image, video or audio model"
    return None


def enumerate_zoo() -> list[ZooModel]:
    """Every backbone, then every text task, of `keras_hub.models`, by name."""
    models = _keras_hub().models
    classes = _public_classes()
    backbones = {}
    for cls in classes:
        if issubclass(cls, models.Backbone) and cls is not models.Backbone:
            backbones[cls] = ZooModel(cls.__name__, "backbone", cls.__name__, _step_one(cls), cls)
    tasks = []
    bases = {name: getattr(models, name) for name in TASK_BASES}
    for cls in classes:
        kinds = [name for name, base in bases.items() if issubclass(cls, base)]
        if not kinds or cls in bases.values():
            continue
        backbone_cls = getattr(cls, "backbone_cls", None)
        if backbone_cls is None:
            continue  # an abstract base with no backbone of its own
        if backbone_cls in backbones:
            reason = backbones[backbone_cls].skip_reason
        else:
            reason = _step_one(backbone_cls)
        if reason:
            reason = f"its backbone {backbone_cls.__name__}: {reason}"
        tasks.append(ZooModel(cls.__name__, kinds[0], backbone_cls.__name__, reason, cls))
    ordered = sorted(backbones.values(), key=lambda model: model.name)
    return ordered + sorted(tasks, key=lambda model: model.name)


def candidates() -> list[ZooModel]:
    """The enumerated classes that pass step 1 of the rule."""
    return [model for model in enumerate_zoo() if model.skip_reason is None]


def by_name(name: str) -> ZooModel:
    for model in enumerate_zoo():
        if model.name == name:
            return model
    raise KeyError(f"{name} is not a keras_hub.models backbone or text task")


def _normalised(name: str) -> str:
    return _SUFFIX.sub("", _PREFIX.sub("", name))


def tiny_arguments(
    cls, given: dict | None = None, *, tiny: dict | None = None, extra: dict | None = None
) -> dict:
    """Constructor arguments for a tiny `cls`, read off its `__init__`: `given`,
    then its entry of `extra` (default `EXTRA`), then sizes from `tiny`
    (default `TINY`). tests/zoo_vision.py passes its own tables."""
    tiny = TINY if tiny is None else tiny
    extra = EXTRA if extra is None else extra
    extra = {**extra.get(cls.__name__, {}), **(given or {})}
    arguments, missing = {}, []
    for parameter in _parameters(cls):
        name = parameter.name
        required = parameter.default is inspect.Parameter.empty
        if name in extra:
            arguments[name] = extra[name]
            continue
        value = tiny.get(name, tiny.get(_normalised(name)))
        shrinkable = isinstance(parameter.default, int) and not isinstance(parameter.default, bool)
        if value is not None and (required or shrinkable):
            arguments[name] = value
        elif required:
            missing.append(name)
    if missing:
        raise NoTinyConfig(f"{cls.__name__}: no tiny value for {', '.join(missing)}")
    return arguments


def _input_dtypes(model) -> dict:
    inputs = model.input
    if isinstance(inputs, dict):
        return {name: str(tensor.dtype) for name, tensor in inputs.items()}
    inputs = inputs if isinstance(inputs, list | tuple) else [inputs]
    return {tensor.name: str(tensor.dtype) for tensor in inputs}


def _integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint")) or dtype == "bool"


def text_input_problem(backbone) -> str | None:
    """Step 2 of the rule: why `backbone`'s inputs are not text, or None."""
    dtypes = _input_dtypes(backbone)
    other = sorted(name for name, dtype in dtypes.items() if not _integer(dtype))
    if other:
        return f"reads non-integer inputs ({', '.join(other)}): images, video or audio"
    if not {"token_ids", "encoder_token_ids"} & set(dtypes):
        return f"no token_ids or encoder_token_ids input (inputs: {', '.join(sorted(dtypes))})"
    return None


def redraw(model, seed: int = SEED, conv_fan_in: bool = False):
    """Every float weight drawn anew from N(0, 0.2); integer state is left alone.

    A BatchNormalization's moving variance is drawn from U(0.5, 1.5) instead: a
    negative variance would be a square root of it, NaN (the image models of
    tests/zoo_vision.py have them; no text model does). With `conv_fan_in`,
    a 2-D convolution's kernel is drawn from N(0, 1 / fan-in) instead, as a
    trained network's keep its activations near 1 (`zoo_vision.CONV_FAN_IN`
    says which models need it and why).
    """
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if "float" not in str(weight.dtype):
            continue
        if weight.path.endswith("moving_variance"):
            value = rng.uniform(0.5, 1.5, size=weight.shape)
        elif conv_fan_in and len(weight.shape) == 4 and weight.path.endswith("/kernel"):
            fan_in = int(np.prod(weight.shape[:-1]))  # (height, width, in, out)
            value = rng.normal(0, fan_in**-0.5, size=weight.shape)
        else:
            value = rng.normal(0, 0.2, size=weight.shape)
        weight.assign(value.astype(weight.dtype))
    return model


def build(name: str):
    """The tiny model `name`, weights redrawn.

    Raises `NotATextModel` when the rule skips it (step 1 or 2), and
    `NoTinyConfig` when a required argument has no tiny value.
    """
    import keras

    entry = by_name(name)
    if entry.skip_reason:
        raise NotATextModel(entry.skip_reason)
    keras.backend.clear_session()  # fresh layer names, whatever ran before
    keras.utils.set_random_seed(SEED)
    backbone_cls = entry.cls if entry.kind == "backbone" else entry.cls.backbone_cls
    backbone = backbone_cls(**tiny_arguments(backbone_cls))
    problem = text_input_problem(backbone)
    if problem:
        prefix = "" if entry.kind == "backbone" else f"its backbone {backbone_cls.__name__} "
        raise NotATextModel(prefix + problem)
    if entry.kind == "backbone":
        model = backbone
    else:
        given = {"backbone": backbone}
        if "preprocessor" in {parameter.name for parameter in _parameters(entry.cls)}:
            given["preprocessor"] = None
        model = entry.cls(**tiny_arguments(entry.cls, given))
    return redraw(model)


# --- an independent feed and the parity check --------------------------------

# Right-padded rows of different true lengths; the decoder's are another length
# altogether, so a swapped encoder/decoder axis cannot go unnoticed.
ENCODER_LENGTHS = (9, 5, 2)
DECODER_LENGTHS = (6, 4, 1)
MASKED_POSITIONS = 3
FEED_ATOL = 1e-4  # the export's own default atol


# Models that take one length only: their padded feed is padded to it. SigLIP's
# text encoder adds its whole position table (32 rows here).
FEED_WIDTH = {"SigLIPTextEncoder": 32}


def _lengths(name: str) -> tuple:
    return DECODER_LENGTHS if name.startswith("decoder_") else ENCODER_LENGTHS


def _valid(lengths: tuple, width: int | None = None) -> np.ndarray:
    return np.arange(width or max(lengths))[None, :] < np.array(lengths)[:, None]


def padded_feed(model, seed: int = 1, width: int | None = None) -> dict:
    """A right-padded batch for every input of `model`, built from input names
    alone (not from the export pipeline's own input roles); `width` pads every
    row to that many tokens (`FEED_WIDTH`), else to the longest row."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, dtype in _input_dtypes(model).items():
        lengths = _lengths(name)
        valid = _valid(lengths, width)
        if name.endswith("token_ids"):
            ids = rng.integers(1, VOCAB, size=valid.shape)
            value = np.where(valid, ids, 0)
        elif name.endswith("padding_mask"):
            value = valid
        elif name == "segment_ids":
            value = np.where(valid, rng.integers(0, 2, size=valid.shape), 0)
        elif name == "position_ids":
            value = np.broadcast_to(np.arange(valid.shape[1]), valid.shape)
        elif name == "mask_positions":
            # Positions inside each row's own valid part, beyond 0 and 1.
            value = np.stack([rng.integers(0, n, size=MASKED_POSITIONS) for n in lengths])
        else:
            raise ValueError(f"no feed rule for input {name!r} ({dtype})")
        feeds[name] = value.astype(dtype)
    return feeds


def _output_mask(value: np.ndarray, feeds: dict) -> np.ndarray | None:
    """Which positions of a (batch, time, ...) output are valid, from its length."""
    if value.ndim < 2:
        return None
    for lengths in (ENCODER_LENGTHS, DECODER_LENGTHS):
        if value.shape[1] == max(lengths) and value.shape[0] == len(lengths):
            return _valid(lengths)
    return None


def parity(model, onnx_path, feeds: dict) -> dict:
    """Max abs difference per output between ONNX Runtime and `model(feeds)`,
    on the valid positions only (padded positions may hold anything)."""
    import keras
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [entry.name for entry in session.get_inputs()]
    unknown = sorted(set(names) - set(feeds))
    if unknown:
        raise ValueError(f"the ONNX file takes inputs the model does not: {unknown}")
    results = session.run(None, {name: feeds[name] for name in names})
    got = dict(zip([entry.name for entry in session.get_outputs()], results, strict=True))
    expected = model(feeds, training=False)
    if not isinstance(expected, dict):
        if len(got) != 1:
            raise ValueError(f"one Keras output, ONNX outputs {sorted(got)}")
        expected = {next(iter(got)): expected}
    differences = {}
    for name, value in expected.items():
        value = keras.ops.convert_to_numpy(value)
        if got[name].shape != value.shape:
            raise ValueError(f"output {name}: ONNX shape {got[name].shape}, Keras {value.shape}")
        mask = _output_mask(value, feeds)
        difference = np.abs(got[name].astype("float64") - value.astype("float64"))
        differences[name] = float((difference[mask] if mask is not None else difference).max())
    return differences
