"""Audio inputs: waveforms told from the model, their samples axis and lengths.

An input is audio when it is a float waveform, `(batch, samples)` or
`(batch, samples, 1)`, that a strided 1-D convolution reads first (directly
or through element-wise layers): keras-hub's Moonshine reads 16 kHz samples
with a `Conv1D` of stride 64. Its axis is `samples`, and a padding mask
named like it (`encoder_padding_mask` beside `encoder_input_values`) runs
along the same axis.

Its lengths are found before any conversion, as an image's sides are: the
fewest samples the model takes (`validating.sample_counts`: Keras runs it
and every output is finite and non-empty), then multiples of it (8 and 32
times): the grid's lengths of other sequences (the decoder's tokens) are
not the audio's, and no position table bounds it. Waveforms are drawn
uniform in -1..1, as decoded audio is.
"""

import numpy as np

from keras_layers.export.images import element_wise_readers

ROLE = "audio"
AXIS = "samples"
# The grid's sample counts, as multiples of the fewest the model takes.
MULTIPLES = (1, 8, 32)
# The most samples searched for the fewest a model takes (two seconds at 16 kHz).
BOUND = 32768


def _strided_conv(layer) -> bool:
    kind = type(layer).__name__
    if not (kind.endswith("1D") and "Conv" in kind) or not type(layer).__module__.startswith(
        "keras."
    ):
        return False
    strides = getattr(layer, "strides", (1,))
    return max(np.atleast_1d(strides)) > 1


def describe(model, name: str, shape: tuple, dtype: str, tensor) -> dict | None:
    """The audio role of one input, or `None` when it is no waveform.

    Args:
        model: the Keras model.
        name: the input's name.
        shape: its declared shape.
        dtype: its dtype's name.
        tensor: its symbolic tensor.

    Returns:
        The `loading.TensorInfo` fields of a waveform: `role`, `axes`,
        `sequence` (`samples`), `role_source` and `role_reason`.
    """
    waveform = len(shape) == 2 or (len(shape) == 3 and shape[2] == 1)
    if not waveform or not dtype.startswith(("float", "bfloat")) or shape[1] is not None:
        return None
    readers = element_wise_readers(model, tensor)
    reader = next((layer for layer in readers if _strided_conv(layer)), None)
    declared = next((layer for layer in readers if getattr(layer, "reads_waveform", False)), None)
    if reader is None and declared is None:
        return None
    if reader is not None:
        strides = int(max(np.atleast_1d(reader.strides)))
        why = f"read by {type(reader).__name__} {reader.name!r} of stride {strides}: a waveform"
    else:  # a wrapper whose call hides the convolution (`seq2seq.encoder_model`'s)
        why = f"read by {type(declared).__name__} {declared.name!r}, which reads a waveform"
    return {
        "role": ROLE,
        "axes": ("batch", AXIS, *shape[2:]),
        "sequence": AXIS,
        "role_source": "wiring",
        "role_reason": why,
    }


def is_audio(info) -> bool:
    """Whether an input is a waveform.

    Args:
        info: the input (`loading.TensorInfo`).

    Returns:
        Its role is `audio`.
    """
    return info.role == ROLE


def with_masks(infos: list) -> list:
    """Padding masks named like a waveform moved onto its `samples` axis.

    Args:
        infos: the model's inputs, roles read.

    Returns:
        `infos`, each padding mask whose name shares a waveform's prefix
        (`encoder_` in `encoder_padding_mask`, `encoder_input_values`) on
        the `samples` axis; so is the only mask beside the only waveform
        (optimum's `input_values` and `attention_mask`).
    """
    from dataclasses import replace

    waves = [info for info in infos if is_audio(info)]
    masks = [info for info in infos if info.is_padding_mask]
    prefixes = {info.name.split("_")[0] for info in waves}
    alone = len(waves) == 1 and len(masks) == 1 and len(infos) == 2
    return [
        replace(info, sequence=AXIS)
        if info.is_padding_mask
        and (alone or ("_" in info.name and info.name.split("_")[0] in prefixes))
        else info
        for info in infos
    ]


def draw(info, batch: int, samples: int, rng) -> np.ndarray:
    """Waveforms for one grid point.

    Args:
        info: the waveform input.
        batch: how many.
        samples: how long.
        rng: a `numpy.random.Generator`.

    Returns:
        Uniform values in -1..1, of the input's dtype and rank.
    """
    shape = [batch, samples, *info.shape[2:]]
    return rng.uniform(-1.0, 1.0, shape).astype(info.dtype)
