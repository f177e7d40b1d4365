"""What each model input is, read from the model's own wiring, not its name.

The validation grid must feed every input something the model accepts: token
ids below the vocabulary of the embedding that reads them, a padding mask that
matches the padding, positions (`mask_positions`) below the sequence length,
and an encoder and a decoder sequence of different lengths. Each input's role
is decided from the layers that consume it:

- read by an embedding layer (`input_dim`), at any depth of layers and
  through casts: `ids`, with that vocabulary (segment ids are ids with a small
  vocabulary), whatever the input's dtype. The model is run once on a probe
  (`probe`) that records what every layer receives, so an embedding inside a
  custom layer is found as surely as one the input feeds directly; id 0 is
  padding when the layer that reads the ids masks it (`mask_zero`, or its own
  `compute_mask`);
- passed to a layer's call argument named `padding_mask`, `*_padding_mask`,
  `attention_mask` or `mask`: `padding_mask`;
- passed to an argument named `positions` or `position_ids`: `token_positions`,
  one per token (0, 1, 2, ... along the sequence);
- passed to an argument named `mask_positions`, `indices` or `*_positions`:
  `positions`, some positions picked among each row's tokens;
- anything else: `features` (random values of its dtype).

Only when no consumer says anything (an input read by plain ops) does the name
decide, and only between a padding mask (an integer or boolean input named
`*mask`) and features. Inputs whose names start with `decoder_` get their own
sequence axis, `decoder_sequence`, varied apart from the encoder's. The caller
can override any of this (`input_roles`, `--input NAME=ROLE[@AXIS]`).

Every role carries its source (`SOURCES`): `wiring` (read from the layers),
`name`, `override` (the caller's) or `default` (nothing said anything: an
integer input read by plain ops gets small random integers). A defaulted role
is printed as a warning with the `--input` override that would fix it.
"""

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from keras_layers.export.errors import UsageError, argument, one_line

ROLES = ("ids", "padding_mask", "positions", "token_positions", "features")
SOURCES = ("wiring", "name", "override", "default")
# The probe's sequence length (or the model's fixed one): long enough that
# each input's 0/1 pattern is its own (2^-16 chance of two alike), short
# enough for any position table.
PROBE_LENGTH = 16
_MASK_ARGUMENT = re.compile(r"(.*_)?padding_mask|attention_mask|mask")
# One position per token (rotary and position encodings read them) ...
_TOKEN_POSITION_ARGUMENT = re.compile(r"positions|position_ids")
# ... or some positions picked among the tokens (a masked-LM head's).
_POSITION_ARGUMENT = re.compile(r"mask_positions|indices|.*_positions")
_WORD = re.compile(r"\w+")


def _call_parameters(layer) -> list[str]:
    try:
        return list(inspect.signature(layer.call).parameters)
    except (TypeError, ValueError):
        return []


def consumers(model, tensor) -> list[tuple[object, str]]:
    """The layer calls, at any depth, that read `tensor` directly.

    Args:
        model: a functional Keras model.
        tensor: one of its symbolic tensors (an input).

    Returns:
        `(layer, call argument)` pairs; positional arguments are named from
        `layer.call`.
    """
    import keras

    found = []
    for layer in model._flatten_layers(include_self=False):
        for node in getattr(layer, "_inbound_nodes", []):
            arguments = getattr(node, "arguments", None)
            if arguments is None:
                continue
            parameters = _call_parameters(layer)
            for position, value in enumerate(arguments.args):
                if any(item is tensor for item in keras.tree.flatten(value)):
                    name = parameters[position] if position < len(parameters) else f"arg{position}"
                    # (`*args` layers such as keras' op layers name no argument.)
                    found.append((layer, name))
            for name, value in arguments.kwargs.items():
                if any(item is tensor for item in keras.tree.flatten(value)):
                    found.append((layer, name))
    return found


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint")) or dtype == "bool"


def _embeddings_reading(readers: list[tuple[object, str]]) -> list:
    """Without a probe: embedding layers (`input_dim`) that take the input as
    their first call argument; else the embedding inside a layer that does
    (keras-hub's `TokenAndPositionEmbedding` wraps its token embedding), never
    inside a whole nested model, whose other embeddings read other inputs."""
    import keras

    first = [layer for layer, name in readers if _call_parameters(layer)[:1] == [name]]
    direct = [layer for layer in first if hasattr(layer, "input_dim")]
    if direct:
        return direct
    return [
        sub
        for layer in first
        if not isinstance(layer, keras.Model)
        for sub in getattr(layer, "_layers", [])
        if hasattr(sub, "input_dim")
    ][:1]


@dataclass
class Probed:
    """What the probe saw of one input: the embeddings that received it (at
    any depth, through casts) and the layer that masks its zeros, if any."""

    embeddings: list
    masking_layer: str | None = None


@dataclass
class Probe:
    """What `probe` saw: each input's `Probed`, and the position tables (an
    `Embedding(input_dim=maxlen)` read with positions 0, 1, 2, ... as the
    keras.io examples write them) as `(layer name, rows)`. When the model
    failed at every size tried, `inputs` is `None` and `failures` says why
    (the roles are then read from the wiring alone, and the report says so)."""

    inputs: dict | None
    position_tables: list
    failures: list = field(default_factory=list)
    size: tuple | None = None  # the (batch, length) the probe ran at

    @property
    def warning(self) -> str | None:
        """One line for the report when the probe failed at some size."""
        if not self.failures:
            return None
        tried = "; ".join(self.failures)
        if self.inputs is None:
            return (
                f"the role probe could not run the model ({tried}), so the inputs' roles are "
                "read from the wiring alone: an input read by an embedding inside a custom "
                "layer may be fed random values instead of ids. Give the grid the model runs "
                "at (--shapes BxS), or say each input's role with --input NAME=ROLE"
            )
        batch, length = self.size
        return f"the role probe ran at {batch}x{length} after failing at {tried}"


def _probe_value(info_shape: tuple, dtype: str, seed: int, size: tuple, widths=()):
    """An input's 0/1 pattern at `size` = (batch, length), trailing axes at
    `widths` where the model leaves them free. A float input of three or more
    axes gets some all-zero frames, so that a mask over frames
    (`keras.layers.Masking`, a `compute_mask` of its own) shows."""
    import numpy as np

    batch, length = size
    if len(widths) == len(info_shape) - 1:  # every axis after the batch given (an image)
        dims = [batch, *widths]
    else:
        trailing = [
            d or w for d, w in zip(info_shape[2:], _padded(widths, info_shape), strict=True)
        ]
        dims = [batch, length, *trailing][: len(info_shape)]
        if len(info_shape) > 1 and info_shape[1] is not None:
            dims[1] = info_shape[1]
    rng = np.random.default_rng(seed)
    pattern = rng.integers(0, 2, size=dims)
    if len(dims) > 2 and not _is_integer(dtype):
        frames = rng.random(dims[:2]) < 0.25
        frames.reshape(-1)[0] = False
        pattern[frames] = 0
    pattern.reshape(-1)[0] = 1  # never all zeros
    return pattern.astype("bool" if dtype == "bool" else dtype)


def _probe_feeds(specs, size: tuple, widths: dict, drawn: dict | None) -> dict:
    """Every input's probe value at `size`: its 0/1 pattern (`_probe_value`),
    or for an input whose role its name and shape already tell (a prompt),
    values drawn as that role's (`drawn`: name -> `draw(batch)`)."""
    drawn = drawn or {}
    return {
        name: drawn[name](size[0])
        if name in drawn
        else _probe_value(shape, dtype, seed, size, widths.get(name, ()))
        for seed, (name, shape, dtype) in enumerate(specs)
    }


def _padded(widths, info_shape) -> tuple:
    """`widths` for axes 2.. of an input of `info_shape`, 1 where not given."""
    count = max(len(info_shape) - 2, 0)
    return tuple(widths)[:count] + (1,) * (count - len(tuple(widths)[:count]))


def _masks_zero(layer, received) -> bool:
    """Whether `layer.compute_mask` masks exactly the zeros of `received`:
    its zero ids, or its all-zero frames (a mask one axis shorter, as
    `keras.layers.Masking` computes over float features)."""
    import numpy as np

    try:
        mask = layer.compute_mask(received)
    except Exception:  # noqa: BLE001 - a layer whose mask needs more than its input
        return False
    if mask is None:
        return False
    try:
        mask = np.asarray(mask)
        received = np.asarray(received)
    except Exception:  # noqa: BLE001 - a mask that is no array
        return False
    zeros = received == 0
    if mask.ndim == zeros.ndim - 1 and zeros.ndim > 2:
        zeros = zeros.all(axis=-1)
    return mask.shape == zeros.shape and bool(zeros.any()) and np.array_equal(mask, ~zeros)


def _run(model, feeds: dict, names: list, structure: str):
    """The model called on `feeds` as it takes them (one tensor, a list, a dict)."""
    args = {"dict": feeds, "list": [feeds[n] for n in names]}.get(structure)
    return model(feeds[names[0]] if args is None else args, training=False)


def _first_line(error: Exception) -> str:
    """The error's type and the line that says what went wrong (Keras wraps
    a layer's error in "Exception encountered when calling ...")."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    stop = next((i for i, line in enumerate(lines) if line.startswith("Arguments received")), None)
    said = [line for line in lines[:stop] if not line.startswith("Exception encountered")]
    line = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", (said or lines or [""])[0])
    return f"{type(error).__name__}: {one_line(line, 200)}"


def probe(
    model, inputs, structure: str, max_length=None, sizes=(), widths=None, drawn=None
) -> Probe:
    """Run the model once and record which layers receive each input's values.

    Each input gets its own pattern of 0s and 1s (valid for any embedding,
    padding mask or vocabulary); a layer whose first argument equals an input's
    pattern (after a cast) reads that input, however deep it sits. The probe
    runs at batch 2 and `PROBE_LENGTH` tokens, then, if the model fails
    there, at the position tables' length (a model that adds its whole table)
    and at each of `sizes` (a model that runs at one batch size only).

    Args:
        model: the Keras model.
        inputs: `(name, shape, dtype)` of each input, in the model's order.
        structure: how the model takes them: `"single"`, `"list"` or `"dict"`.
        max_length: the longest sequence its position tables allow.
        sizes: more `(batch, length)` pairs to try (the caller's grid).
        widths: input name -> the sizes of its free trailing axes
            (`feature_widths`).
        drawn: input name -> `draw(batch)`, for inputs fed as their role
            draws them (`_probe_feeds`: SAM 3's boxes name an image of the
            batch, which a 0/1 pattern would not).

    Returns:
        A `Probe`; its `inputs` is `None` when the model fails at every size
        (the roles are then read from the wiring alone), and its `failures`
        say where it failed.
    """
    if any(not (_is_integer(dtype) or dtype.startswith("float")) for _, _, dtype in inputs):
        return Probe(None, [])  # strings: refused later, with their own message
    length = min(PROBE_LENGTH, max_length or PROBE_LENGTH)
    names = [name for name, _, _ in inputs]
    seen: list[tuple[object, object]] = []
    layers = list(model._flatten_layers(include_self=False))

    def recording(layer):
        call = layer.call

        def wrapper(*args, **kwargs):
            if args:
                seen.append((layer, args[0]))
            return call(*args, **kwargs)

        return wrapper

    failures, feeds, size = [], None, None
    for layer in layers:
        object.__setattr__(layer, "call", recording(layer))
    try:
        # At the position tables' length too: a model that adds its whole
        # table (keras-hub's SigLIP text encoder) runs there only.
        bounded = [(2, max_length)] if max_length and max_length <= 4 * PROBE_LENGTH else []
        for size in dict.fromkeys([(2, length), *bounded, *(tuple(s) for s in sizes)]):
            feeds = _probe_feeds(inputs, size, widths or {}, drawn)
            seen.clear()
            try:
                _run(model, feeds, names, structure)
                break
            except Exception as error:  # noqa: BLE001 - said in the report, then retried
                failures.append(f"{size[0]}x{size[1]}: {_first_line(error)}")
                feeds = None
    finally:
        for layer in layers:
            object.__delattr__(layer, "call")
    if feeds is None:
        return Probe(None, [], failures)
    found, tables = _readers(seen, feeds, size[1])
    return Probe(found, tables, failures, size)


def _readers(seen: list, feeds: dict, length: int) -> tuple[dict, list]:
    """Each input's `Probed` and the position tables, from what every layer
    received (`seen`: `(layer, first argument)`) when fed `feeds` of
    `length` tokens."""
    import numpy as np

    patterns = {name: value.astype("int64") for name, value in feeds.items()}
    found = {name: Probed([]) for name in feeds}
    tables = []
    for layer, received in seen:
        try:
            value = np.asarray(received)
        except Exception:  # noqa: BLE001 - not a tensor (a list, a dict)
            continue
        if _reads_positions(layer, value, length) and (layer.name, layer.input_dim) not in tables:
            tables.append((layer.name, int(layer.input_dim)))
        for name, pattern in patterns.items():
            if value.shape != pattern.shape or not np.array_equal(value, pattern):
                continue
            if hasattr(layer, "input_dim") and layer not in found[name].embeddings:
                found[name].embeddings.append(layer)
            if found[name].masking_layer is None and _masks_zero(layer, received):
                found[name].masking_layer = layer.name
    return found, tables


def _weight_sizes(layers) -> list[int]:
    """The sizes of every axis of these layers' weights, largest first."""
    sizes = {int(d) for layer in layers for w in layer.weights for d in w.shape if d and d > 1}
    return sorted(sizes, reverse=True)


def feature_widths(model, inputs, structure: str, sizes=(), given=None, drawn=None) -> dict:
    """The sizes to feed an input's free trailing axes (`keras.Input(shape=
    (None, None))`, a feature width left open), read from the model.

    The candidates are the sizes of the weights of the layers that read the
    input (of every weight when those hold none); the first the model runs
    at, largest first, is the width. A model that broadcasts (a position
    table of width 1024 added to frames of width 1 runs) would otherwise be
    checked at width 1 only.

    Args:
        model: the Keras model.
        inputs: `(name, shape, dtype, symbolic tensor)` of each input.
        structure: as `probe` takes it.
        sizes: `(batch, length)` pairs to run at, after batch 2 x 3.
        given: input name -> every size after the batch, for inputs whose
            axes are known otherwise (images, at the probe's side): fed so,
            never searched.
        drawn: as `probe` takes it.

    Returns:
        Input name -> `(widths, source)`: a width per trailing axis and the
        sentence that says where they come from; only inputs with free
        trailing axes.

    Raises:
        UsageError: the model runs at none of the candidates.
    """
    found = {}
    given = dict(given or {})
    names = [name for name, _, _, _ in inputs]
    specs = [(name, shape, dtype) for name, shape, dtype, _ in inputs]
    for name, shape, _, tensor in inputs:
        free = [axis for axis in range(2, len(shape)) if shape[axis] is None]
        if not free or name in given:
            continue
        readers = [layer for layer, _ in consumers(model, tensor)]
        candidates = _weight_sizes(readers) or _weight_sizes([model])
        where = ", ".join(repr(layer.name) for layer in readers[:2]) or "the model"
        for width in candidates[:12]:
            widths = tuple(width if d is None else d for d in shape[2:])
            trial = {**given, **{n: w for n, (w, _) in found.items()}, name: widths}
            if _runs_at(model, specs, names, structure, trial, sizes, drawn):
                found[name] = (
                    widths,
                    f"its free feature axis is fed {width}, a size of the weights of {where} "
                    "that the model runs at",
                )
                break
        else:
            raise UsageError(
                f"input {name!r} is declared {_shape_text(shape)}: its feature width is left "
                f"open and the model runs at none of the sizes its weights suggest "
                f"({', '.join(map(str, candidates[:12])) or 'none'}). Declare the width in the "
                f"model, e.g. keras.Input(shape=(None, WIDTH)), and save it again"
            )
    return found


def _runs_at(model, specs, names, structure, widths: dict, sizes, drawn=None) -> bool:
    for size in dict.fromkeys([(2, 3), *(tuple(s) for s in sizes)]):
        feeds = _probe_feeds(specs, size, widths, drawn)
        try:
            _run(model, feeds, names, structure)
            return True
        except Exception:  # noqa: BLE001 - this width or size is not the model's
            continue
    return False


def _shape_text(shape) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def _reads_positions(layer, value, length: int) -> bool:
    """Whether an embedding received positions 0, 1, ..., `length` - 1: as
    many as the probe's tokens (more than 2), so that the table bounds the
    text. A constant `arange` of another count (SAM's four mask tokens) is
    a table of its own, not of positions."""
    import numpy as np

    if not isinstance(getattr(layer, "input_dim", None), int) or value.ndim == 0:
        return False
    if value.shape[-1] != length:
        return False
    rows = value.reshape(-1, length) if value.size else value
    return length > 2 and bool(np.all(rows == np.arange(length)))


def role_of(name: str, dtype: str, readers: list[tuple[object, str]], probed=None) -> dict:
    """The role of one input, what generating it needs, and why.

    Args:
        name: the input's name.
        dtype: its dtype's name.
        readers: the layer calls that read it directly (`consumers`).
        probed: what `probe` saw of it, or `None` when the probe could not run.

    Returns:
        `role`, `vocabulary`, `masks_zero`, `sequence` (its sequence axis's
        name), `role_source` (one of `SOURCES`) and `role_reason`, as
        `loading.TensorInfo` takes them.
    """
    embeddings = probed.embeddings if probed is not None else _embeddings_reading(readers)
    if probed is None and not _is_integer(dtype):
        # Without the probe, a float input is ids only where an embedding
        # reads it itself: one inside a custom layer may read positions.
        embeddings = [e for e in embeddings if any(e is layer for layer, _ in readers)]
    sequence = "decoder_sequence" if name.startswith("decoder_") else "sequence"
    masking = probed.masking_layer if probed is not None else None
    masking = masking or next(
        (layer.name for layer in embeddings if getattr(layer, "mask_zero", False)), None
    )
    found = {
        "role": "features",
        "vocabulary": None,
        "masks_zero": masking is not None,
        "sequence": sequence,
    }
    if embeddings:
        vocabulary = min(int(layer.input_dim) for layer in embeddings)
        reason = f"read by embedding {embeddings[0].name!r} (vocabulary {vocabulary})"
        if masking:
            reason += f"; 0 is padding (masked by {masking!r})"
        return {
            **found,
            "role": "ids",
            "vocabulary": vocabulary,
            "role_source": "wiring",
            "role_reason": reason,
        }
    by_argument = {argument_name: layer for layer, argument_name in readers}
    for role, pattern in (
        ("token_positions", _TOKEN_POSITION_ARGUMENT),
        ("positions", _POSITION_ARGUMENT),
        ("padding_mask", _MASK_ARGUMENT),
    ):
        matched = [a for a in by_argument if pattern.fullmatch(a)]
        if _is_integer(dtype) and matched:
            layer = by_argument[matched[0]]
            reason = f"passed as {matched[0]!r} to layer {layer.name!r}"
            return {**found, "role": role, "role_source": "wiring", "role_reason": reason}
    semantic = [a for a in by_argument if not a.startswith("arg") and a not in ("inputs", "x")]
    if not semantic and _is_integer(dtype) and name.lower().endswith("mask"):
        reason = "an integer input named *mask, read by plain ops"
        return {**found, "role": "padding_mask", "role_source": "name", "role_reason": reason}
    if not _is_integer(dtype):
        reason = f"{dtype} values that no embedding reads"
        if masking:
            reason += f"; all-zero frames are padding (masked by {masking!r})"
        return {**found, "role_source": "wiring", "role_reason": reason}
    reason = f"{dtype} values that no embedding, mask or positions argument reads"
    if masking:
        reason += f"; 0 is padding (masked by {masking!r})"
    return {**found, "role_source": "default", "role_reason": reason}


def default_role_warning(info) -> str:
    """The warning for an input whose role was only defaulted.

    Args:
        info: the input (`loading.TensorInfo`).

    Returns:
        One line naming the input, what it is fed, and the override.
    """
    return (
        f"input {info.name!r}: nothing in the model says what it is ({info.role_reason}), "
        f"so it gets small random integers; if it is token ids, a mask or positions, say so "
        f"with --input {info.name}=ROLE (ROLE one of {', '.join(ROLES)})"
    )


def max_sequence_length(model, position_tables=()) -> tuple[int | None, str | None]:
    """The longest sequence the model's position tables allow.

    Args:
        model: the Keras model; keras-hub `PositionEmbedding(sequence_length=...)`
            and the layers that hold a `sequence_length` bound it.
        position_tables: `(layer name, rows)` of the embeddings `probe` saw
            read positions 0, 1, 2, ... (`Probe.position_tables`).

    Returns:
        The bound and the layer that sets it; `(None, None)` when nothing does.
    """
    bound, source = None, None
    for name, rows in position_tables:
        if bound is None or rows < bound:
            bound, source = rows, name
    for layer in model._flatten_layers(include_self=False):
        length = getattr(layer, "sequence_length", None)
        if isinstance(length, int) and length > 0 and (bound is None or length < bound):
            bound, source = length, layer.name
    return bound, source


@dataclass(frozen=True)
class InputRole:
    """How to generate one input when the role read from the model is not the
    one wanted (`input_roles`, `--input NAME=ROLE[@AXIS]`).

    Attributes:
        role: one of `ROLES`.
        axis: the name of the input's sequence axis (inputs that share a name
            share a length); `None` keeps the one read from the model.
    """

    role: str
    axis: str | None = None

    def __post_init__(self) -> None:
        axis_ok = self.axis is None or (isinstance(self.axis, str) and _WORD.fullmatch(self.axis))
        if self.role not in ROLES or not axis_ok:
            raise ValueError(
                f"{str(self)!r} is not ROLE[@AXIS] with ROLE one of {', '.join(ROLES)}"
            )

    def __str__(self) -> str:
        return f"{self.role}@{self.axis}" if self.axis else str(self.role)


def parse_override(text: str) -> tuple[str, InputRole]:
    """Parse one `NAME=ROLE[@AXIS]` override.

    Args:
        text: the override as the command line takes it.

    Returns:
        The input's name and its `InputRole`.

    Raises:
        ValueError: `text` is not of that form, or ROLE is none of `ROLES`.
    """
    match = re.fullmatch(r"([^=]+)=(\w+)(?:@(\w+))?", text)
    if not match or match.group(2) not in ROLES:
        raise ValueError(f"{text!r} is not NAME=ROLE[@AXIS] with ROLE one of {', '.join(ROLES)}")
    return match.group(1), InputRole(match.group(2), match.group(3))


def apply_overrides(infos: list, overrides: Mapping[str, InputRole]) -> list:
    """Replace detected roles by the caller's.

    Args:
        infos: the model's inputs (`loading.TensorInfo`), as read from it.
        overrides: input name -> `InputRole` (`ExportOptions.input_roles`,
            where they were checked).

    Returns:
        `infos` with each named input's role (and sequence axis, when the
        override names one) replaced.

    Raises:
        UsageError: an override names no input of the model.
    """
    names = {info.name for info in infos}
    for name, override in overrides.items():
        if name not in names:
            raise UsageError(
                f"{argument('input_roles', {name: str(override)})}: the model has no input "
                f"{name!r}; its inputs are {sorted(names)}"
            )
        infos = [
            replace(
                info,
                role=override.role,
                sequence=override.axis or info.sequence,
                role_source="override",
                role_reason=f"--input {name}={override}",
            )
            if info.name == name
            else info
            for info in infos
        ]
    return infos


# Keras names an input it was not given a name for `keras_tensor_N`: a name
# that says nothing in the file, and changes from one session to the next.
_AUTOMATIC_NAME = re.compile(r"keras_tensor(_\d+)?|input_layer(_\d+)?")
_ROLE_NAMES = {
    "image": "images",
    "ids": "token_ids",
    "padding_mask": "padding_mask",
    "positions": "mask_positions",
    "token_positions": "positions",
    "features": "inputs",
}


def named_by_role(infos: list) -> list:
    """Inputs with Keras' automatic names (`keras_tensor_28`) named after
    their roles (`images`, `token_ids`, ...; `_1`, `_2` where several share
    one), never taking a name another input has.

    Args:
        infos: the model's inputs (`loading.TensorInfo`), roles read; only
            for a model that takes them as one tensor or a list (a dict's
            keys are the model's own).

    Returns:
        `infos`, renamed.
    """
    taken = {info.name for info in infos if not _AUTOMATIC_NAME.fullmatch(info.name)}
    renamed = []
    for info in infos:
        if not _AUTOMATIC_NAME.fullmatch(info.name):
            renamed.append(info)
            continue
        base = _ROLE_NAMES.get(info.role, "inputs")
        name, count = base, 0
        while name in taken:
            count += 1
            name = f"{base}_{count}"
        taken.add(name)
        renamed.append(replace(info, name=name))
    return renamed
