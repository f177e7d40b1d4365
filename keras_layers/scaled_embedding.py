"""`ScaledEmbedding`: a token embedding multiplied by a constant."""

import math

import keras
from keras import ops


def scale_factor(scale, output_dim: int) -> float:
    """Resolve a `scale` argument to the number the embeddings are multiplied by.

    `"sqrt"` means `sqrt(output_dim)`, a positive real number is used as is and
    `None` means no scaling (a factor of 1).

    Args:
        scale: `"sqrt"`, a positive finite number, or None.
        output_dim: the embedding width.

    Returns:
        The factor, a positive float.

    Raises:
        ValueError: `scale` is none of those.
    """
    if scale is None:
        return 1.0
    if isinstance(scale, str):
        if scale == "sqrt":
            return math.sqrt(output_dim)
    elif isinstance(scale, int | float) and not isinstance(scale, bool):
        if math.isfinite(scale) and scale > 0:
            return float(scale)
    raise ValueError(
        f'`scale` must be "sqrt", a positive finite number or None. Received: scale={scale!r}'
    )


@keras.saving.register_keras_serializable(package="keras_layers")
class ScaledEmbedding(keras.layers.Embedding):
    """A token embedding whose output is multiplied by a constant.

    A drop-in subclass of `keras.layers.Embedding`: the same arguments, the same
    `embeddings` variable, the same mask (`mask_zero`), LoRA and quantization
    (`layer.quantize("int8")`) keep working. The only change is that the looked-up
    vectors are multiplied by `scale`, `sqrt(output_dim)` by default, as in the
    Transformer of Vaswani et al. (2017), section 3.4.

    Writing `x = embedding(ids) * sqrt(d)` by hand in a functional model drops the
    Keras mask: the multiplication is not a layer, so the padding mask never
    reaches the attention layers after it. Scaling inside the layer keeps it.

    The default initializer matches the scale. A scale `s` only makes sense
    together with weights of standard deviation `1 / s`: then each component of
    the *scaled* output has unit variance at initialisation, the same magnitude
    as the sinusoidal position encoding (whose components have variance 1/2),
    and the same matrix used as a tied output projection produces logits of
    variance about `d / s**2 = 1` (for `s = sqrt(d)`). This is what
    tensor2tensor and fairseq do (normal with stddev `d**-0.5`). Keras' default
    uniform(-0.05, 0.05) multiplied by `sqrt(512)` gives components of standard
    deviation 0.65 instead, and one that shrinks relative to the position
    encoding as `d` shrinks.

    Args:
        input_dim: Integer, size of the vocabulary (maximum token id + 1).
        output_dim: Integer, the embedding width `d_model`.
        scale: `"sqrt"` (default) for `sqrt(output_dim)`, a positive number, or
            `None` for no scaling (then the layer is a plain `Embedding`).
            `layer.scale` holds the argument as given.
        embeddings_initializer: Initializer for the embedding matrix. `None`
            (default) picks the initializer that matches `scale`: normal with
            stddev `1 / factor`, or Keras' `"uniform"` when `scale` is `None`.
        mask_zero: Boolean, whether id 0 is padding to be masked.
        **kwargs: Any other `keras.layers.Embedding` argument
            (`embeddings_regularizer`, `embeddings_constraint`, `lora_rank`,
            `name`, `dtype`, ...).

    Call arguments:
        inputs: Integer tensor of token ids, any shape.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> layer = ScaledEmbedding(input_dim=100, output_dim=16, mask_zero=True)
    >>> out = ops.convert_to_numpy(layer(np.array([[5, 7, 0]])))
    >>> out.shape
    (1, 3, 16)
    >>> float(layer.factor)
    4.0
    >>> table = ops.convert_to_numpy(layer.embeddings.value)
    >>> np.allclose(out, 4.0 * np.take(table, [[5, 7, 0]], axis=0))
    True

    References:
        - Vaswani et al., "Attention Is All You Need", 2017, section 3.4:
          "In the embedding layers, we multiply those weights by sqrt(d_model)."
        - Press & Wolf, "Using the Output Embedding to Improve Language
          Models", 2017 (the tied input/output matrix).
        - docs/conventions.md: the settings that reproduce GPT-2, BERT, T5,
          Gemma and Llama at the embedding end, trained side by side.
    """

    def __init__(
        self,
        input_dim,
        output_dim,
        scale="sqrt",
        embeddings_initializer=None,
        mask_zero=False,
        **kwargs,
    ):
        super().__init__(
            input_dim,
            output_dim,
            embeddings_initializer=embeddings_initializer or "uniform",
            mask_zero=mask_zero,
            **kwargs,
        )
        self.scale = scale
        self.factor = scale_factor(scale, output_dim)
        # Remember whether the initializer was chosen for the user, so that the
        # config keeps saying "matched to the scale" rather than a frozen copy.
        self._initializer_is_matched = embeddings_initializer is None
        if self._initializer_is_matched and scale is not None:
            self.embeddings_initializer = keras.initializers.RandomNormal(
                mean=0.0, stddev=1.0 / self.factor
            )

    def _apply_scale(self, outputs):
        if self.factor == 1.0:
            return outputs
        return ops.multiply(outputs, ops.cast(self.factor, outputs.dtype))

    def call(self, inputs):
        return self._apply_scale(super().call(inputs))

    def quantize(self, mode=None, type_check=True, **kwargs):
        # Keras refuses to quantize Embedding subclasses unless they opt in; the
        # weights are the parent's, so its quantization applies unchanged.
        if type_check and type(self) is not ScaledEmbedding:
            raise self._not_implemented_error(self.quantize)
        super().quantize(mode, type_check=False, **kwargs)

    def quantized_call(self, *args, **kwargs):
        # Quantized embeddings bypass `call`; scale their output the same way.
        return self._apply_scale(super().quantized_call(*args, **kwargs))

    def get_config(self):
        config = super().get_config()
        config["scale"] = self.scale
        if self._initializer_is_matched:
            config["embeddings_initializer"] = None
        return config
