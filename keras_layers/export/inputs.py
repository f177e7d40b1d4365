"""What each model input is, read from the model's own wiring, not its name.

The validation grid must feed every input something the model accepts: token
ids below the vocabulary of the embedding that reads them, a padding mask that
matches the padding, positions (`mask_positions`) below the sequence length,
and an encoder and a decoder sequence of different lengths. Each input's role
is decided from the layers that consume it:

- read by an embedding layer (`input_dim`): `ids`, with that vocabulary (segment
  ids are ids with a small vocabulary);
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
"""

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from keras_layers.export.errors import UsageError, argument

ROLES = ("ids", "padding_mask", "positions", "token_positions", "features")
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
    """Embedding layers (`input_dim`) that take the input as their first call
    argument; else the embedding inside a layer that does (keras-hub's
    `TokenAndPositionEmbedding` wraps its token embedding), never inside a
    whole nested model, whose other embeddings read other inputs."""
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


def role_of(name: str, dtype: str, readers: list[tuple[object, str]]) -> dict:
    """The role of one input and what generating it needs.

    Args:
        name: the input's name.
        dtype: its dtype's name.
        readers: the layer calls that read it (`consumers`).

    Returns:
        `role`, `vocabulary`, `masks_zero` and `sequence` (its sequence
        axis's name), as `loading.TensorInfo` takes them.
    """
    embeddings = _embeddings_reading(readers)
    sequence = "decoder_sequence" if name.startswith("decoder_") else "sequence"
    found = {"role": "features", "vocabulary": None, "masks_zero": False, "sequence": sequence}
    if embeddings and _is_integer(dtype):
        return {
            **found,
            "role": "ids",
            "vocabulary": min(int(layer.input_dim) for layer in embeddings),
            "masks_zero": any(bool(getattr(layer, "mask_zero", False)) for layer in embeddings),
        }
    arguments = {argument_name for _, argument_name in readers}
    if _is_integer(dtype) and any(_TOKEN_POSITION_ARGUMENT.fullmatch(a) for a in arguments):
        return {**found, "role": "token_positions"}
    if _is_integer(dtype) and any(_POSITION_ARGUMENT.fullmatch(a) for a in arguments):
        return {**found, "role": "positions"}
    if _is_integer(dtype) and any(_MASK_ARGUMENT.fullmatch(a) for a in arguments):
        return {**found, "role": "padding_mask"}
    semantic = [a for a in arguments if not a.startswith("arg") and a not in ("inputs", "x")]
    if not semantic and _is_integer(dtype) and name.lower().endswith("mask"):
        return {**found, "role": "padding_mask"}
    return found


def max_sequence_length(model) -> tuple[int | None, str | None]:
    """The longest sequence the model's position tables allow, and the layer
    that sets it (keras-hub `PositionEmbedding(sequence_length=...)` and the
    layers that hold one); `(None, None)` when nothing bounds it."""
    bound, source = None, None
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
            replace(info, role=override.role, sequence=override.axis or info.sequence)
            if info.name == name
            else info
            for info in infos
        ]
    return infos
