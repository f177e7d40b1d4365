"""Synthetic training data for the conformance models.

A few batches of the right shapes and dtypes, drawn from a fixed seed, so that
two steps of `fit` move every weight away from its initial value. Token rows
are right-padded with id 0 the way tokenizers and `padded_batch` pad them, so
that a model that masks padding is trained with its mask in play.
"""

import numpy as np


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def token_ids(
    generator: np.random.Generator, rows: int, length: int, vocabulary_size: int
) -> np.ndarray:
    """Ids in [1, vocabulary_size), every other row right-padded with 0.

    The first row is always full length; the padded rows keep at least one token.
    """
    ids = generator.integers(1, vocabulary_size, size=(rows, length))
    lengths = generator.integers(1, length + 1, size=rows)
    lengths[::2] = length
    ids[np.arange(length)[None, :] >= lengths[:, None]] = 0
    return ids


def labels(generator: np.random.Generator, shape, classes: int) -> np.ndarray:
    return generator.integers(0, classes, size=shape)


def features(generator: np.random.Generator, shape) -> np.ndarray:
    return generator.standard_normal(size=shape).astype("float32")


def train(model, x, y, *, batch_size: int, **fit_arguments) -> None:
    """`model.fit` for one epoch over `x` (two or three batches), run eagerly.

    Tracing the train step costs 5-10 s a model on two cores, eager steps a
    fraction of that; the model keeps the compile arguments of its example
    (`run_eagerly` is restored, and it is not part of the compile config).
    """
    compiled_eagerly = model.run_eagerly
    model.run_eagerly = True
    try:
        model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, **fit_arguments)
    finally:
        model.run_eagerly = compiled_eagerly
