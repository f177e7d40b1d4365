"""Backend-neutral conversion of tensors and variables to NumPy for assertions."""

import keras


def as_numpy(value, dtype=None):
    """NumPy copy of a tensor, variable or array on any Keras backend (a torch
    tensor that requires grad cannot go through `np.asarray`)."""
    if isinstance(value, keras.Variable):
        value = value.value
    array = keras.ops.convert_to_numpy(value)
    return array if dtype is None else array.astype(dtype)
