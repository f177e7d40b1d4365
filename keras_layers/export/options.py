"""`ExportOptions`: every setting of an export, typed, checked once.

`export_model(model, output, ExportOptions(...), task=...)` takes them as one
value, and the command line builds one from its flags. Each setting is
checked when the options are made (`__post_init__`), before any work, with
the errors `export_model` has always raised: a `UsageError` that names the
argument as the caller spelled it (`opset=99`, or `--opset 99` on the command
line). What needs the model (a grid longer than its position tables, an input
it does not have, a module that does not import) is checked once the model
is loaded.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from keras_layers.export import converting, decoder_gate, validating
from keras_layers.export.decoding import SAMPLERS
from keras_layers.export.errors import UsageError, argument
from keras_layers.export.inputs import InputRole, parse_override

EXTERNAL_DATA_CHOICES = ("auto", "always", "never")
QUANTIZE_CHOICES = ("int8", "int4")
WEIGHTS_DTYPE_CHOICES = ("float32", "float16", "keep")
# `MatMulNBits`' accuracy levels a quantized decoder may take (`quantizing`).
ACCURACY_LEVELS = (1, 4)
ACCURACY_LEVEL = 4
# keras-hub's numbers of its samplers (`keras_hub.samplers.TopKSampler`,
# `TopPSampler`), which a causal-lm folder's search takes unless given.
SAMPLER_DEFAULTS = {"top_k": 5, "top_p": 0.1, "temperature": 1.0}
# The numbers each sampler reads.
_SAMPLER_NUMBERS = {"top_k": ("top_k",), "top_p": ("top_p",), "temperature": ("top_k", "top_p")}


@dataclass(frozen=True)
class ExportOptions:
    """How to export, check and report; every field has a working default.

    Attributes:
        report_path: where the JSON report goes (default `OUTPUT.report.json`
            beside the output, without `.onnx`).
        shapes: the validation grid: `(batch, sequence)` pairs and `"padded"`
            (a right-padded batch). Default: batch 1, 2, 8 x sequence 1, 7, 64,
            256 (or the model's fixed length), plus `"padded"` when the model
            masks padding. For a model of images, `(batch, side)` pairs of
            square images and `"structured"` (a gradient, edges, a constant
            image); default: batch 1, 2, 8 x the smallest side the model takes
            and those it takes near 37 and 96 (or its fixed size), plus
            `"structured"`. For a model that takes prompts a user may leave
            out (SAM's boxes and mask), `"unprompted"` too: one row without
            them.
        atol: absolute tolerance of every check.
        rtol: relative tolerance, times |Keras output|.
        opset: the ONNX opset to convert to (13 up to tf2onnx's newest).
        imports: modules to import first: the custom layers and functions they
            define are found by name, registered or not; only for these is the
            working directory searched.
        unsafe: allow Lambda layers when loading a file (runs code stored in it).
        external_data: `"auto"` (weights in a data file beside the graph,
            `OUTPUT.<content hash>.data`, when over ~1.8 GB), `"always"` or
            `"never"`.
        weights_dtype: how the matrix weights are stored: `"float32"`,
            `"float16"`, or `"keep"` (the dtype of the model's variables:
            bfloat16 or float16 for a model built in that dtype policy,
            float32 otherwise); computed in float32 either way
            (`passes.weights_dtype`). Weights rounded to float16 are checked
            at `validating.HALF_WEIGHTS_ATOL` and `HALF_WEIGHTS_RTOL` at least.
            With `quantize` and a causal-lm folder, `"keep"` streams the
            stored weights into the quantized folder without a float32 copy
            (`genai_folder`; chosen by itself when float32 would not fit).
        quantize: `"int8"` also writes `OUTPUT.int8.onnx`, quantized dynamically
            and judged by its top-1 agreement with Keras pooled over the grid.
            With `--task causal-lm` or `seq2seq-lm` and a folder output, `"int8"`
            or `"int4"` also writes `FOLDER/int8/` or `FOLDER/int4/`: the
            decoder's (and encoder's) weights quantized (`MatMulNBits`), gated
            by `keras_layers.export.decoder_gate`'s measures.
        decoder_min_agreement: a quantized decoder's gate: the least mean share
            of greedy tokens equal to Keras' before the first difference.
        decoder_max_nll_change: a quantized decoder's gate: the largest mean
            |log-probability change| of a held-out text's tokens, in nats.
        decoder_accuracy_level: how a quantized decoder's `MatMulNBits`
            compute: 4 (the activations quantized to int8 inside the op, as
            onnxruntime-genai's model builder does on CPU; the fastest) or 1
            (float32 from the dequantized weights: slower, no rounding of the
            activations). Only with `quantize` and a causal-lm or seq2seq-lm folder.
        int8_min_top1: the int8 file's gate: the least share of real tokens
            (at least `validating.INT8_MIN_TOKENS` of them over the grid) whose
            top-1 class agrees with Keras', between 0 and 1.
        allow_nonfinite: accept NaN or infinity in Keras' own outputs (the
            ONNX output must have the same ones); by default such a check fails,
            since a model that computes NaN is broken whatever the file does.
        input_roles: how to generate an input and name its sequence axis, when
            the role read from the model is not the one wanted: `{name:
            InputRole(ROLE, AXIS)}`, or the same as text, `{name: "ROLE"}` or
            `{name: "ROLE@AXIS"}`; ROLE one of `ids`, `padding_mask`,
            `token_positions`, `positions`, `features` (see
            `keras_layers.export.inputs`). Kept as `InputRole`s.
        memory_check: refuse, before any work, an export whose estimated peak
            memory exceeds what the machine has available (`memory.check_fits`).
        sampler: the search a causal-lm folder's `genai_config.json` sets
            (what onnxruntime-genai does unless its user sets another):
            `"greedy"` (None: the default), `"top_k"` or `"top_p"`. The
            model's compiled sampler is never read: a `.keras` file does not
            keep it, and keras-hub compiles every task with top-k when it is
            made, so a model's sampler does not say what its user chose.
        top_k: the top-k sampler's k (default 5, keras-hub's); only with
            `sampler="top_k"`.
        top_p: the top-p sampler's p, in (0, 1] (default 0.1, keras-hub's);
            only with `sampler="top_p"`.
        temperature: the samplers' temperature, > 0 (default 1); only with
            `sampler="top_k"` or `"top_p"`.
        context_length: a causal-lm folder's `context_length`, the longest
            sequence genai runs: at most the model's position table (its
            length by default); for a model whose positions have no table
            (rotary: Llama, Gemma, Mistral, ...) the preprocessor's
            `sequence_length` by default, and needed without a preprocessor.
        end_token_id: a causal-lm folder's end id (written as the start, end
            and pad ids), needed for a model without preprocessor: genai stops
            at the config's end id and takes 0 when none is written. With a
            preprocessor, its tokenizer's end id is written (a different one
            is refused).
        extra_report: entries added to the report as they are.
        preprocessor: export a keras-hub text task with its preprocessor as
            one file that takes strings (`keras_layers.export.export_model`
            hands it to `text_model.export_text_model`).
        text_pairs: with `preprocessor`, a second string input, `text_pair`.
        channels_first: the file takes its NHWC images as NCHW
            (`pixel_values`, as optimum's vision files and tf2onnx's
            `--inputs-as-nchw` take them): one Transpose in front of the
            model, which the slim stage cancels against the first Conv's.
        parts: a composite model (two towers, a promptable segmenter, latent
            diffusion: `keras_layers.export.parts`) as one file per part in
            a folder, each proved on its own.

    Raises:
        UsageError: a setting is out of range or malformed (on creation).

    Example:

    >>> ExportOptions(shapes=[(1, 3)], input_roles={"flags": "ids@tokens"}).input_roles
    {'flags': InputRole(role='ids', axis='tokens')}
    """

    report_path: Path | None = None
    shapes: list | None = None
    atol: float = validating.DEFAULT_ATOL
    rtol: float = validating.DEFAULT_RTOL
    opset: int = converting.DEFAULT_OPSET
    imports: tuple[str, ...] = ()
    unsafe: bool = False
    external_data: str = "auto"
    weights_dtype: str = "float32"
    quantize: str | None = None
    int8_min_top1: float = validating.INT8_MIN_TOP1
    decoder_min_agreement: float = decoder_gate.MIN_AGREEMENT
    decoder_max_nll_change: float = decoder_gate.MAX_NLL_CHANGE
    decoder_accuracy_level: int = ACCURACY_LEVEL
    allow_nonfinite: bool = False
    sampler: str | None = None
    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    context_length: int | None = None
    end_token_id: int | None = None
    input_roles: Mapping[str, InputRole] = field(default_factory=dict)
    memory_check: bool = True
    extra_report: Mapping | None = None
    preprocessor: bool = False
    text_pairs: bool = False
    channels_first: bool = False
    parts: bool = False

    def __post_init__(self) -> None:
        _set = object.__setattr__  # the one place a frozen field is normalised
        _set(self, "atol", _tolerance("atol", self.atol))
        _set(self, "rtol", _tolerance("rtol", self.rtol))
        for name in ("int8_min_top1", "decoder_min_agreement", "decoder_max_nll_change"):
            _set(self, name, _tolerance(name, getattr(self, name)))
        for name in ("int8_min_top1", "decoder_min_agreement"):
            if getattr(self, name) > 1:
                raise UsageError(f"{argument(name, getattr(self, name))}: must be <= 1")
        converting.check_opset(self.opset)
        _check_choice("quantize", self.quantize, QUANTIZE_CHOICES, "unsupported; ", none_ok=True)
        _check_choice("external_data", self.external_data, EXTERNAL_DATA_CHOICES, "")
        _check_choice("weights_dtype", self.weights_dtype, WEIGHTS_DTYPE_CHOICES, "")
        if self.quantize and self.weights_dtype == "float16":
            raise UsageError(
                f"{argument('weights_dtype', self.weights_dtype)}: the quantized files are made "
                "from float32 weights, or with keep streamed from the stored ones; leave "
                "weights_dtype at float32 (or keep) with quantize"
            )
        self._check_accuracy_level()
        self._check_folder_settings()
        if self.shapes is not None:
            _set(self, "shapes", validating.check_shapes(self.shapes))
        _set(self, "report_path", Path(self.report_path) if self.report_path else None)
        imports = (self.imports,) if isinstance(self.imports, str) else tuple(self.imports)
        _set(self, "imports", imports)
        _set(self, "input_roles", _input_roles(self.input_roles))
        for name in ("preprocessor", "text_pairs", "channels_first", "parts"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{argument(name, getattr(self, name))}: give True or False")
        if self.channels_first and self.preprocessor:
            raise UsageError(
                f"{argument('channels_first', True)}: not taken with preprocessor=True (its "
                "file takes decoded images, height x width x channels, as decoders give them); "
                "leave one out"
            )
        if self.parts and self.preprocessor:
            raise UsageError(
                f"{argument('parts', True)}: not taken with preprocessor=True; export the parts "
                "without the preprocessor"
            )
        if self.text_pairs and not self.preprocessor:
            raise UsageError(
                f"{argument('text_pairs', True)}: only with preprocessor=True; add it, or leave "
                "this out"
            )

    def _check_accuracy_level(self) -> None:
        level = self.decoder_accuracy_level
        if isinstance(level, bool) or level not in ACCURACY_LEVELS:
            raise UsageError(
                f"{argument('decoder_accuracy_level', level)}: give one of "
                f"{', '.join(map(str, ACCURACY_LEVELS))} (4: int8 activations, the "
                "fastest; 1: float32 compute)"
            )
        if level != ACCURACY_LEVEL and self.quantize is None:
            raise UsageError(
                f"{argument('decoder_accuracy_level', level)}: sets how a quantized decoder "
                "computes; only with quantize (and a causal-lm or seq2seq-lm folder), or leave "
                "it out"
            )

    def _check_folder_settings(self) -> None:
        """The sampler, its numbers, the context length and the end id of a
        causal-lm folder; whether the export writes one is the API's to say
        (`genai_folder.refuse_folder_options`)."""
        _check_choice("sampler", self.sampler, SAMPLERS, "", none_ok=True)
        for name, samplers in _SAMPLER_NUMBERS.items():
            value = getattr(self, name)
            if value is not None and self.sampler not in samplers:
                raise UsageError(
                    f"{argument(name, value)}: a number of the {' or '.join(samplers)} "
                    f"sampler; add {argument('sampler', samplers[0])}, or leave this out"
                )
        for name, (valid, wanted) in _FOLDER_NUMBERS.items():
            value = getattr(self, name)
            if value is not None and not valid(value):
                raise UsageError(f"{argument(name, value)}: give {wanted}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# A causal-lm folder's numbers: what each must be, and its wording.
_FOLDER_NUMBERS = {
    "top_k": (lambda k: _is_int(k) and k >= 1, "a whole number >= 1"),
    "top_p": (lambda p: _is_real(p) and 0 < p <= 1, "a number in (0, 1]"),
    "temperature": (lambda t: _is_real(t) and t > 0, "a finite number > 0"),
    "context_length": (lambda n: _is_int(n) and n >= 2, "a whole number >= 2"),
    "end_token_id": (lambda i: _is_int(i) and i >= 0, "a token id >= 0"),
}


def _tolerance(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"{argument(name, value)}: must be a finite number >= 0")
    if value < 0:
        raise UsageError(f"{argument(name, value)}: must be >= 0")
    return float(value)


def _check_choice(name: str, value, choices: tuple, why: str, none_ok: bool = False) -> None:
    if (value is None and none_ok) or value in choices:
        return
    raise UsageError(f"{argument(name, value)}: {why}choose one of {choices}")


def _input_roles(roles) -> dict[str, InputRole]:
    """`InputRole`s by input name; text values (`"ROLE@AXIS"`) parsed here."""
    if roles is None:
        return {}
    if not isinstance(roles, Mapping):
        raise UsageError(f"{argument('input_roles', roles)}: give a dict {{name: role}}")
    parsed = {}
    for name, value in roles.items():
        if isinstance(value, InputRole):
            parsed[name] = value
            continue
        try:
            _, parsed[name] = parse_override(f"{name}={value}")
        except ValueError as error:
            raise UsageError(f"{argument('input_roles', {name: value})}: {error}") from None
    return parsed
