"""Random weights that 4 bits hold exactly, as quantization-aware training leaves them.

A causal LM drawn at random has nearly flat next-token distributions, so the
error of rounding its weights to 4 bits flips its greedy tokens whatever the
export does: such a model cannot show that an int4 export computes what Keras
computes. Weights drawn on the int4 grid can. Each block of `BLOCK` values
along a matrix's input axis is `scale * k` with integers `k` in [-8, 7], one
of them -8, and a power-of-two `scale` of its own: ONNX Runtime's symmetric
block quantizer (scale = the block's signed extreme / -8) then finds exactly
that scale and those integers, and the values are exact in bfloat16 and
float16 too. An int4 file of such a model computing in float32
(`--decoder-accuracy-level 1`) gives Keras' logits up to float rounding; a
file whose blocks, scales or layout are wrong does not.

Used by `benchmarks/big_model.py --streamed ... --on-grid` and
`tests/test_streamed_quantizing.py`.
"""

import math

import numpy as np

BLOCK = 32


def draw(shape, std: float, rng: np.random.Generator, input_axes: int = 1) -> np.ndarray:
    """float32 values of `shape`, exact on the int4 grid of blocks of `BLOCK`.

    Args:
        shape: the variable's shape; its first `input_axes` axes, flattened,
            are the matrix product's input axis (the one blocks run along;
            a last block of fewer than 16 values may not be exact).
        std: about the standard deviation wanted (the scales are powers of two).
        rng: where the integers and the scales are drawn from.
        input_axes: how many leading axes the product contracts.

    Returns:
        The values, float32.

    Example:

    >>> values = draw((64, 3), 0.02, np.random.default_rng(0))
    >>> blocks = values.reshape(2, 32, 3)
    >>> scale = blocks.min(axis=1, keepdims=True) / -8
    >>> bool(np.all(blocks / scale == np.round(blocks / scale)))
    True
    """
    rows = math.prod(shape[:input_axes])
    columns = math.prod(shape[input_axes:])
    k = rng.integers(-7, 8, size=(rows, columns), dtype=np.int8).astype(np.float32)
    # Each run of 16 rows holds one -8 in every column (the block's extreme,
    # which sets its scale) and one 7 that keeps the mean near zero.
    for row in range(16):  # (row + column) % 16 == 0 is -8, == 8 is 7
        k[row::16, -row % 16 :: 16] = -8
        k[row::16, (8 - row) % 16 :: 16] = 7
    base = np.float32(2.0 ** np.round(np.log2(std / float(k.std()))))
    blocks = -(-rows // BLOCK)
    scales = base * np.float32(2.0) ** rng.integers(-1, 2, size=(blocks, 1, columns))
    padded = np.zeros((blocks * BLOCK, columns), np.float32)
    padded[:rows] = k
    del k
    values = (padded.reshape(blocks, BLOCK, columns) * scales).reshape(-1, columns)[:rows]
    return values.reshape(shape)


def input_axes(path: str) -> int:
    """How many leading axes of a keras-hub decoder's kernel `path` its
    product contracts: two for an attention output's (heads, head size,
    hidden), one for every other kernel and for an embedding."""
    return 2 if "attention_output" in path else 1


def redraw(model, rng: np.random.Generator, std: float = 0.02) -> None:
    """Give every matrix of `model` values on the int4 grid, every vector ones.

    Args:
        model: a keras-hub decoder (its kernels named as `input_axes` reads them).
        rng: where the values are drawn from.
        std: about the matrices' standard deviation.
    """
    for variable in model.weights:
        if len(variable.shape) > 1:
            values = draw(tuple(variable.shape), std, rng, input_axes(variable.path))
        else:
            values = np.ones(tuple(variable.shape), np.float32)
        variable.assign(values)
        del values
