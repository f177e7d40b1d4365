"""`TiedOutputDense`: pre-softmax logits that share an embedding's matrix."""

import keras
from keras import ops


def _embedding_matrix(embedding):
    """The `(vocab, d)` matrix of an embedding layer, or None if it has none."""
    try:
        matrix = embedding.embeddings
    except (AttributeError, ValueError):
        return None
    shape = getattr(matrix, "shape", None)
    return matrix if shape is not None and len(shape) == 2 else None


@keras.saving.register_keras_serializable(package="keras_layers")
class TiedOutputDense(keras.layers.Layer):
    """Output logits that reuse the matrix of an existing embedding layer.

    `call(hidden)` returns `hidden @ E^T (+ bias)`, where `E` is
    `embedding.embeddings`, the very variable the embedding layer looks tokens up
    in (never a copy). This is the tied input/output embedding of Press & Wolf
    (2017) and of the Transformer paper (section 3.4). Gradients from both uses
    reach the one matrix.

    Unlike `ReversibleEmbedding(reverse=True)`, the embedding can be any layer
    that owns an `embeddings` matrix of shape `(vocab, d)`: a plain
    `keras.layers.Embedding`, `ScaledEmbedding`, `keras.layers.ReversibleEmbedding`
    or the `token_embedding` of keras-hub's `TokenAndPositionEmbedding`. An
    unbuilt embedding is built.

    The tie survives `model.save()` and `keras.saving.load_model()`: the config
    refers to the embedding layer, and Keras restores both references as one
    object inside a model save. `keras.models.clone_model()` rebuilds each layer
    from its config alone, which would create a fresh, untied matrix; a layer
    rebuilt that way refuses to be called and points to
    `keras_layers.clone_model_keeping_ties`.

    Args:
        embedding: The embedding layer whose `embeddings` matrix is shared.
        use_bias: Whether to add a learned bias of shape `(vocab,)`.
        logit_scale: Optional positive number multiplying the logits (T5 uses
            `d_model ** -0.5`).
        logit_soft_cap: Optional positive number `c`; logits become
            `c * tanh(logits / c)` (Gemma 2).
        logits_dtype: dtype in which the projection is computed and the logits
            returned. `None` (default) uses the layer's variable dtype: float32
            under the `mixed_float16` and `mixed_bfloat16` policies, so the
            softmax after it stays stable.
        bias_initializer: Initializer for the bias.
        **kwargs: Base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: Float tensor of shape `(..., d)`.

    Example:

    >>> import numpy as np
    >>> import keras
    >>> embedding = keras.layers.Embedding(10, 4)
    >>> head = TiedOutputDense(embedding)
    >>> hidden = np.ones((2, 3, 4), "float32")
    >>> tuple(keras.ops.shape(head(hidden)))
    (2, 3, 10)
    >>> bool(head.embedding.embeddings is embedding.embeddings)
    True

    References:
        - Press & Wolf, "Using the Output Embedding to Improve Language
          Models", 2017: logits = h E^T with E the input embedding.
        - Vaswani et al., "Attention Is All You Need", 2017, section 3.4.
        - docs/conventions.md: `logit_scale`, `logit_soft_cap` and the tie as
          T5, Gemma 2, GPT-2 and Llama set them, trained side by side.
    """

    def __init__(
        self,
        embedding,
        use_bias=False,
        logit_scale=None,
        logit_soft_cap=None,
        logits_dtype=None,
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(embedding, keras.layers.Layer):
            raise TypeError(
                "`embedding` must be a Keras layer that owns an `embeddings` "
                "matrix (keras.layers.Embedding, ScaledEmbedding, "
                "ReversibleEmbedding, ...). "
                f"Received: embedding={embedding!r} of type {type(embedding).__name__}"
            )
        if not embedding.built:
            try:
                embedding.build()
            except TypeError:
                pass  # Needs an input shape; checked again in `build()`.
        if embedding.built and _embedding_matrix(embedding) is None:
            raise ValueError(
                "`embedding` must own an `embeddings` matrix of shape (vocab, d). "
                f"Layer {embedding.name!r} ({type(embedding).__name__}) has none."
            )
        for name, value in (
            ("logit_scale", logit_scale),
            ("logit_soft_cap", logit_soft_cap),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            ):
                raise ValueError(
                    f"`{name}` must be None or a positive number. Received: {name}={value!r}"
                )
        if not isinstance(use_bias, bool):
            raise ValueError(f"`use_bias` must be True or False. Received: use_bias={use_bias!r}")
        self.embedding = embedding
        self.use_bias = use_bias
        self.logit_scale = logit_scale
        self.logit_soft_cap = logit_soft_cap
        self.logits_dtype = (
            None if logits_dtype is None else keras.backend.standardize_dtype(logits_dtype)
        )
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True
        # Set by `from_config` when the embedding was rebuilt without the layer
        # it was tied to (see `_check_tie`).
        self._rebuilt_alone = False

    @property
    def _output_dtype(self):
        return self.logits_dtype or self.variable_dtype

    def build(self, input_shape):
        if not self.embedding.built:
            try:
                self.embedding.build()
            except TypeError:
                # A layer that needs an input shape to build (a Dense) is no
                # embedding: say that, not Keras' "build() missing input_shape".
                pass
        matrix = _embedding_matrix(self.embedding) if self.embedding.built else None
        if matrix is None:
            raise ValueError(
                "`embedding` must own an `embeddings` matrix of shape (vocab, d). "
                f"Layer {self.embedding.name!r} ({type(self.embedding).__name__}) has none: "
                "tie to a keras.layers.Embedding, ReversibleEmbedding or ScaledEmbedding."
            )
        vocab, width = matrix.shape
        if input_shape[-1] is not None and input_shape[-1] != width:
            raise ValueError(
                f"TiedOutputDense {self.name!r}: the hidden width ({input_shape[-1]}) "
                f"differs from the width of embedding {self.embedding.name!r} "
                f"({width}). Project the hidden states to {width} first."
            )
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(vocab,), initializer=self.bias_initializer
            )

    def _check_tie(self, inputs):
        if self._rebuilt_alone and not self.embedding._inbound_nodes:
            raise ValueError(
                f"TiedOutputDense {self.name!r} was rebuilt from its config alone "
                "(as keras.models.clone_model does), so its embedding "
                f"{self.embedding.name!r} is a fresh copy, not the layer it was "
                "tied to. Clone with keras_layers.clone_model_keeping_ties(model), "
                "or save and load the whole model with keras.saving.load_model."
            )

    def __call__(self, inputs, *args, **kwargs):
        self._check_tie(inputs)
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs):
        dtype = self._output_dtype
        hidden = ops.cast(inputs, dtype)
        matrix = ops.cast(self.embedding.embeddings, dtype)
        logits = ops.matmul(hidden, ops.transpose(matrix))
        if self.use_bias:
            logits = logits + ops.cast(self.bias, dtype)
        if self.logit_scale is not None:
            logits = logits * ops.cast(self.logit_scale, dtype)
        if self.logit_soft_cap is not None:
            cap = ops.cast(self.logit_soft_cap, dtype)
            logits = cap * ops.tanh(logits / cap)
        return logits

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.embedding.input_dim)

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype=self._output_dtype)

    def compute_mask(self, inputs, mask=None):
        return mask

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "embedding": keras.saving.serialize_keras_object(self.embedding),
                "use_bias": self.use_bias,
                "logit_scale": self.logit_scale,
                "logit_soft_cap": self.logit_soft_cap,
                "logits_dtype": self.logits_dtype,
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        embedding_config = config.pop("embedding")
        # Inside `load_model`, an embedding that the model also holds carries a
        # shared-object id and comes back as that very layer. Without one, this
        # layer is being rebuilt on its own and its embedding is a fresh copy.
        shared = "shared_object_id" in embedding_config
        embedding = keras.saving.deserialize_keras_object(embedding_config)
        layer = cls(embedding=embedding, **config)
        layer._rebuilt_alone = not shared
        return layer


def clone_model_keeping_ties(model, **kwargs):
    """`keras.models.clone_model` that keeps `TiedOutputDense` layers tied.

    Every layer is cloned from its config, as `clone_model` does, except that a
    `TiedOutputDense` is tied to the clone of its original embedding layer, so
    the clone has one shared matrix exactly where the original had one. Keyword
    arguments go to `keras.models.clone_model` (`input_tensors`,
    `call_function`, ...).

    Args:
        model: the model to clone.
        **kwargs: passed to `keras.models.clone_model`.

    Returns:
        The clone.

    Raises:
        ValueError: `clone_function` is given (this function sets it).

    Example:

    >>> import keras
    >>> ids = keras.Input((None,), dtype="int32")
    >>> embedding = keras.layers.Embedding(50, 8)
    >>> logits = TiedOutputDense(embedding)(embedding(ids))
    >>> clone = clone_model_keeping_ties(keras.Model(ids, logits))
    >>> head = clone.layers[-1]
    >>> bool(head.embedding is clone.layers[1])
    True
    """
    clones = {}

    def clone(layer):
        if id(layer) in clones:
            return clones[id(layer)]
        if isinstance(layer, TiedOutputDense):
            config = layer.get_config()
            config.pop("embedding")
            new = TiedOutputDense(embedding=clone(layer.embedding), **config)
        else:
            new = layer.__class__.from_config(layer.get_config())
        clones[id(layer)] = new
        return new

    if "clone_function" in kwargs:
        raise ValueError(
            "clone_model_keeping_ties sets `clone_function` itself; use "
            "keras.models.clone_model to pass your own."
        )
    return keras.models.clone_model(model, clone_function=clone, **kwargs)
