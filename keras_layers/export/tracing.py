"""Stage 2, trace: wrap the Keras model in a `tf.function` with an explicit signature.

`tf2onnx.convert.from_keras` is broken on Keras 3 (tensorflow-onnx#2329, #2348,
#2448), so the pipeline converts a `tf.function` instead. Its input signature is
derived from the model: input names are the Keras input names (or dict keys),
dtypes are kept, and outputs come back as a dict keyed by the output names, which
tf2onnx turns into the ONNX output names.

The weights are inputs of the function too, not captured variables: inside a
`keras.StatelessScope` every variable read returns the tensor passed for it.
tf2onnx then never sees a weight as a constant, so it does not copy, fold or
serialise them (frozen into the graph, a large embedding is re-serialised after
each tf2onnx pass and fails past protobuf's 2 GiB; see docs/export.md, "Models
over 2 GB"), and a tied matrix reaches ONNX once, as one input read by the lookup and
by a `Transpose` for the output projection. The conversion stage turns these
inputs into initializers holding the variables' values.
"""

import importlib
import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from keras_layers.export import compat
from keras_layers.export.compat import patched
from keras_layers.export.einsums import einsum_layout, explicit_ellipsis
from keras_layers.export.errors import ConversionError, one_line
from keras_layers.export.loading import LoadedModel, flatten, unique_variables
from keras_layers.export.sequence_loops import python_loops_as_graph_loops
from keras_layers.export.validating import keras_outputs, make_inputs, point_label

WEIGHT_PREFIX = "keras_layers.weight_"


@dataclass
class TracedModel:
    """The output of `trace`: a `tf.function`, its input signature and weights.

    `signature` lists the model inputs, then one spec per weight; `weights` are
    the variables behind those specs, in the same order.
    """

    function: object
    signature: list
    input_names: list
    output_names: list
    weights: list

    def weight_input_names(self) -> list:
        return [spec.name for spec in self.signature[len(self.input_names) :]]


@contextmanager
def _attention_as_batched_matmuls():
    """Trace Keras' dot-product attention as transposes and batched matmuls.

    On TensorFlow, `keras.ops.dot_product_attention` (which `MultiHeadAttention`
    and keras-hub's encoders call) computes `einsum("BTNH,BSNH->BNTS")` and
    `einsum("BNTS,BSNH->BTNH")`. tf2onnx's einsum optimizer lowers each to 5-D
    transposes, squeezes and shape arithmetic, and extra copies at run time.
    The same products written as `transpose` + `matmul` reach ONNX as four
    `Transpose` and two `MatMul` nodes, and the padding mask selects the
    logits in one `Where` instead of Keras' expand-then-select (with the
    `SelectV2` handler in `keras_layers.export.op_handlers`); the node counts
    of exported models are in benchmarks/results/zoo.json. The large negative
    value, scaling and softmax stay Keras' own, so the result differs only in
    float summation order, and the export's validation checks it like
    everything else. If a Keras release renames the private function this
    replaces, the trace keeps Keras' einsums.
    """
    try:
        from keras.src.backend.tensorflow import nn
    except ImportError:
        yield
        return
    original = compat.original(nn, "_dot_product_attention_xla", None)
    masks = getattr(nn, "_apply_masks", None)
    large_negative = getattr(nn, "_get_large_negative", None)
    if original is None or masks is None or large_negative is None:
        yield
        return
    import tensorflow as tf

    def attention(query, key, value, bias, mask, is_causal, scale):
        heads_first = [0, 2, 1, 3]  # (B, T, N, H) <-> (B, N, T, H)
        query, key, value = (tf.transpose(t, heads_first) for t in (query, key, value))
        wide = tf.float64 if query.dtype == tf.float64 else tf.float32  # as Keras does
        logits = tf.cast(tf.matmul(query, key, transpose_b=True), wide)
        logits = tf.multiply(logits, tf.cast(scale, logits.dtype))
        if bias is not None:
            logits = tf.add(logits, tf.cast(bias, logits.dtype))
        if mask is not None and not is_causal:
            # Keras ANDs the mask into `ones_like(logits)` first; `where`
            # broadcasts it anyway, so that expand (5 nodes a layer) is skipped.
            logits = tf.where(mask, logits, large_negative(logits.dtype))
        else:
            logits = masks(logits, mask, is_causal)
        probs = tf.cast(tf.nn.softmax(logits, axis=-1), key.dtype)
        return tf.transpose(tf.matmul(probs, value), heads_first)

    with patched(nn, "_dot_product_attention_xla", attention):
        yield


@contextmanager
def _einsums_for_onnx():
    """Trace grouped-query attention's einsums as transposes and one `MatMul`,
    and write out ellipses.

    tf2onnx lowers `einsum("btkgh,bskh->bkgts")` with dynamic batch and length
    to 6-D transposes and shape arithmetic; written as
    `einsums.einsum_layout` says, it is 2-3 transposes, an `Unsqueeze` and one
    `MatMul`, a form `fusions.fuse_attention` matches. Same float products,
    summed in a different order. An equation with "..." (which tf2onnx
    rejects) gets letters for it (`einsums.explicit_ellipsis`). Other einsums
    keep Keras' own code.
    """
    try:
        from keras.src.backend.tensorflow import numpy as backend_numpy
    except ImportError:
        yield
        return
    original = compat.original(backend_numpy, "einsum", None)
    if original is None:
        yield
        return
    import tensorflow as tf

    def einsum(subscripts, *operands, **kwargs):
        if isinstance(subscripts, str) and "..." in subscripts and not kwargs:
            ranks = [tf.convert_to_tensor(x).shape.rank for x in operands]
            subscripts = explicit_ellipsis(subscripts, ranks) or subscripts
        layout = einsum_layout(subscripts) if isinstance(subscripts, str) else None
        if layout is None or len(operands) != 2 or kwargs:
            return original(subscripts, *operands, **kwargs)
        a, b = (tf.convert_to_tensor(x) for x in operands)
        if a.dtype != b.dtype or not a.dtype.is_floating:
            return original(subscripts, *operands, **kwargs)
        perm_a, insert_a, perm_b, insert_b, after = layout
        if perm_a != sorted(perm_a):
            a = tf.transpose(a, perm_a)
        if perm_b != sorted(perm_b):
            b = tf.transpose(b, perm_b)
        for axis in insert_a:
            a = tf.expand_dims(a, axis)
        for axis in insert_b:
            b = tf.expand_dims(b, axis)
        product = tf.matmul(a, b)
        return product if after is None else tf.transpose(product, after)

    with patched(backend_numpy, "einsum", einsum):
        yield


def _swappable(module: str, name: str, companion: str) -> tuple | None:
    """The module, its original `name` and its `companion`, for a swap of
    a Keras internal that calls a companion of the same module; `None` when
    the module does not import or either attribute is missing (another
    Keras version: the trace then keeps Keras' own code)."""
    try:
        owner = importlib.import_module(module)
    except ImportError:
        return None
    original = compat.original(owner, name, None)
    other = getattr(owner, companion, None)
    return None if original is None or other is None else (owner, original, other)


@contextmanager
def _grouped_convs_without_xla():
    """Trace a grouped convolution as TensorFlow's own `Conv2D` op.

    Keras' TensorFlow backend runs a convolution whose input has more
    channels than its kernel takes (groups: keras.io's ConvMixer, a
    `Conv2D(groups=...)`) inside a `tf.function(jit_compile=True)`, because
    TensorFlow's CPU kernels do not run grouped convolutions; the trace then
    holds a `PartitionedCall` that tf2onnx cannot convert. The graph needs no
    kernel: traced here as the plain `tf.nn.convolution` (TensorFlow infers
    the groups from the kernel), it converts to ONNX's `Conv` with `group`,
    and the validation runs the file against Keras like any other. Other
    convolutions keep Keras' code.
    """
    found = _swappable("keras.src.backend.tensorflow.nn", "conv", "_convert_data_format")
    if found is None:
        yield
        return
    nn, original, convert = found
    import keras
    import tensorflow as tf

    def conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
        data_format = (data_format or keras.config.image_data_format()).lower()
        channels = inputs.shape[-1] if data_format == "channels_last" else inputs.shape[1]
        if channels == kernel.shape[-2] or len(inputs.shape) == 5:
            return original(inputs, kernel, strides, padding, data_format, dilation_rate)
        return tf.nn.convolution(
            inputs,
            kernel,
            strides,
            padding.upper(),
            data_format=convert(data_format, len(inputs.shape)),
            dilations=dilation_rate,
        )

    with patched(nn, "conv", conv):
        yield


@contextmanager
def _fourier_transforms_as_products():
    """Trace Keras' `fft2` as products with the DFT's cosine and sine tables.

    FNet mixes its tokens with the real part of a 2-D Fourier transform
    (`ops.fft2` over the sequence and the hidden axis); TensorFlow computes it
    on complex tensors, which tf2onnx cannot convert (ONNX has no complex
    type). Over the last two axes, sizes M and N, the transform is
    `F_M X F_N` with `F_k = C_k - i S_k` (`C_k[a, b] = cos(2 pi ab / k)`,
    `S_k` the sine): for `X = R + iI`, `A = C_M R + S_M I` and
    `B = C_M I - S_M R`, the real part is `A C_N + B S_N` and the imaginary
    part `B C_N - A S_N`. A fixed size's tables are constants computed here
    in float64; a dynamic size's (the sequence) are built in the graph from
    the tensor's shape, their angles reduced modulo k in float64, so both are
    exact in float32 at any length. (Built in the graph for a fixed size
    too, onnxslim 0.1.98 folds them wrongly: every angle 0.) The products
    sum in another order than an FFT: the export's validation compares them
    with Keras' FFT like everything else. Other models keep Keras' code.
    """
    try:
        from keras.src.backend.tensorflow import math as backend_math
    except ImportError:
        yield
        return
    original = compat.original(backend_math, "fft2", None)
    if original is None:
        yield
        return
    import tensorflow as tf

    def tables(size, static):
        if static is not None:  # a fixed size: the tables are weights of the graph
            turns = np.outer(np.arange(static), np.arange(static)) % static
            angle = turns * (2.0 * math.pi / static)
            return tf.constant(np.cos(angle), tf.float32), tf.constant(np.sin(angle), tf.float32)
        # A dynamic size (the sequence): computed at run time, ab mod k in
        # float64, exact for any length a model holds (ab < 2^53).
        size = tf.cast(size, tf.float64)
        index = tf.range(size, dtype=tf.float64)
        product = index[:, None] * index[None, :]
        turns = product - tf.floor(product / size) * size
        angle = turns * (2.0 * math.pi / size)
        return tf.cast(tf.cos(angle), tf.float32), tf.cast(tf.sin(angle), tf.float32)

    def fft2(x):
        real, imag = (tf.convert_to_tensor(part) for part in x)
        if real.dtype != tf.float32 or imag.dtype != tf.float32 or real.shape.rank < 2:
            return original(x)
        shape = tf.shape(real)
        cos_m, sin_m = tables(shape[-2], real.shape[-2])
        cos_n, sin_n = tables(shape[-1], real.shape[-1])
        a = tf.matmul(cos_m, real) + tf.matmul(sin_m, imag)
        b = tf.matmul(cos_m, imag) - tf.matmul(sin_m, real)
        return tf.matmul(a, cos_n) + tf.matmul(b, sin_n), tf.matmul(b, cos_n) - tf.matmul(a, sin_n)

    with patched(backend_math, "fft2", fft2):
        yield


@contextmanager
def _resizes_to_traced_sizes():
    """Trace `keras.ops.image.resize` to a size that is a tensor.

    `UpSampling2D(interpolation="bilinear")` (BASNet's decoder, keras.io's
    U-Nets) resizes to its input's sides times its factor; on free image
    sides those are tensors, and `ops.image.resize` first checks
    `size[0] <= 0` in Python, which a traced tensor cannot answer (Keras
    3.15: "Using a symbolic `tf.Tensor` as a Python `bool`"). A size with a
    tensor in it goes straight to the backend's resize, the function Keras
    calls after its checks; the other sizes keep Keras' code, checks and
    all. The validation runs the file against Keras like any other.
    """
    found = _swappable("keras.src.ops.image", "resize", "_resize")
    if found is None:
        yield
        return
    image, original, backend_resize = found
    import tensorflow as tf

    def resize(images, size, *args, **kwargs):
        if isinstance(size, list | tuple) and any(isinstance(side, tf.Tensor) for side in size):
            return backend_resize(images, size, *args, **kwargs)
        return original(images, size, *args, **kwargs)

    with patched(image, "resize", resize):
        yield


def _is_python_control_flow(error: Exception) -> bool:
    """TensorFlow's ways of saying that Python code asked a symbolic tensor for
    its value (`if tensor:`, `range(tensor)`), which only eager execution has."""
    import tensorflow as tf

    text = str(error)
    return isinstance(error, tf.errors.OperatorNotAllowedInGraphError) or (
        isinstance(error, TypeError)
        and "SymbolicTensor" in text
        and "cannot be interpreted as an integer" in text
    )


def _raise_if_keras_itself_fails(loaded: LoadedModel) -> None:
    """Tell a model that cannot run in Keras (a usage error, exit 2) from a
    failure of the trace (a bug of ours, exit 3): run it eagerly on one small
    generated input, outside any tracing."""
    import numpy as np

    # Images at the smallest side the model takes (a BASNet takes none under 32).
    size = loaded.image_sides[0] if loaded.image_sides else 3
    feeds = make_inputs(loaded, (1, size), np.random.default_rng(0))
    keras_outputs(loaded, feeds, point_label(loaded, (1, size)))


def trace(loaded: LoadedModel) -> TracedModel:
    """Wrap the model in a `tf.function` whose weights are inputs.

    Args:
        loaded: the model and its described inputs and outputs (`loading.load`).

    Returns:
        The traced function, its input signature (the model's inputs, then one
        spec per unique weight) and the weights in that order.
    """
    import tensorflow as tf

    model = loaded.model
    specs = [tf.TensorSpec(shape=i.shape, dtype=i.dtype, name=i.name) for i in loaded.inputs]
    input_names = [info.name for info in loaded.inputs]
    output_names = [info.name for info in loaded.outputs]
    keras_names = [info.keras_name for info in loaded.outputs]

    def pack(tensors):
        if loaded.input_structure == "dict":
            return dict(zip(input_names, tensors, strict=True))
        if loaded.input_structure == "list":
            return list(tensors)
        return tensors[0]

    def call(*inputs):
        return flatten(model(pack(inputs), training=False), keras_names)

    return trace_call(loaded, call, specs, output_names)


def trace_call(loaded: LoadedModel, call, specs: list, output_names: list) -> TracedModel:
    """Trace `call(*inputs) -> list of outputs` over the model's weights.

    The shared half of every trace (`trace`, and `causal_lm.trace` for the
    decoder with a cache): each unique weight of `loaded.model` becomes an
    input after `specs`, read through a `keras.StatelessScope`, and Keras'
    attention is traced as batched matmuls.

    Args:
        loaded: the loaded model, whose weights become inputs.
        call: the computation, on the inputs of `specs`.
        specs: one `tf.TensorSpec` per input of the file, named as it.
        output_names: the file's output names, in `call`'s order.

    Returns:
        The traced function, its signature (`specs`, then one spec per
        weight) and the weights in that order.

    Raises:
        UsageError: the model fails in Keras itself.
        ConversionError: it uses Python control flow on a tensor's value.
    """
    import keras
    import tensorflow as tf

    weights = unique_variables(loaded.model)
    signature = list(specs) + [
        tf.TensorSpec(shape=variable.shape, dtype=variable.dtype, name=f"{WEIGHT_PREFIX}{index}")
        for index, variable in enumerate(weights)
    ]
    input_names = [spec.name for spec in specs]

    def serve(*tensors):
        inputs, values = tensors[: len(specs)], tensors[len(specs) :]
        with keras.StatelessScope(state_mapping=list(zip(weights, values, strict=True))):
            outputs = call(*inputs)
        return dict(zip(output_names, outputs, strict=True))

    function = tf.function(serve, input_signature=signature, autograph=False)
    try:
        with (
            _attention_as_batched_matmuls(),
            _einsums_for_onnx(),
            _grouped_convs_without_xla(),
            _fourier_transforms_as_products(),
            _resizes_to_traced_sizes(),
            python_loops_as_graph_loops(loaded.model),
        ):
            function.get_concrete_function(*signature)  # traced now, reused by convert
    except Exception as error:
        _raise_if_keras_itself_fails(loaded)
        if _is_python_control_flow(error):
            raise ConversionError(
                "the model cannot be traced into a static graph: a layer uses a tensor's "
                "value as a Python bool or int (Python control flow on data), which runs "
                f"eagerly but has no ONNX graph ({one_line(str(error), 200)})"
            ) from error
        raise  # Keras runs the model: the failure is the trace's, ours to fix
    return TracedModel(function, signature, input_names, output_names, weights)
