"""The one place where the export touches other libraries' internals.

Every private attribute of Keras, TensorFlow or NumPy that the export uses is
listed in `INTERNALS`, with the versions it was written for and why. Those it
swaps for the length of one call are swapped only through `patched`, which
puts the original back whatever happens. `tests/test_compat.py` checks that each listed attribute
still exists in the versions installed, so an upgrade that removes one fails
loudly in the tests instead of silently changing an export.

A swap is seen by the thread that made it and by no other: while a block runs,
the attribute holds a dispatcher that calls the replacement in that thread and
the original everywhere else, so a layer built, or an attention computed, in
another thread meanwhile behaves as if the export were not running
(`tests/test_compat.py::test_a_swap_is_invisible_to_other_threads`).
"""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module

_MISSING = object()


@dataclass(frozen=True)
class Internal:
    """One private attribute of another library that the export uses.

    Attributes:
        module: the module that holds it, or holds the class that does.
        path: the attribute, dotted from the module (`"Variable._direct_assign"`).
        written_for: the library and versions our code was written against.
        user: the function of ours that uses it, and why.
        swapped: True when `patched` replaces it for the length of a call,
            False when our code only reads or calls it.
        added: True for an attribute the installed versions lack and the
            export adds for a call (`numpy.product`, gone in NumPy 2).
    """

    module: str
    path: str
    written_for: str
    user: str
    swapped: bool = True
    added: bool = False

    def owner(self):
        """The object whose attribute it is (imports its module)."""
        owner = import_module(self.module)
        for part in self.path.split(".")[:-1]:
            owner = getattr(owner, part)
        return owner

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


_KERAS = "keras 3.5-3.15"
_SAVING = "keras.src.saving.saving_lib"
_KERAS_HUB = "keras-hub 0.21-0.32"
_PADDING = "causal_lm.padding_inputs: the decoder's attention_mask and position_ids"
# keras-hub's decoder layers that import its causal mask by name (one each).
CAUSAL_MASK_USERS = (
    "layers.modeling.transformer_decoder",
    *(
        f"models.{name}"
        for name in (
            "llama.llama_decoder",
            "mistral.mistral_transformer_decoder",
            "mixtral.mixtral_decoder",
            "gemma.gemma_decoder_block",
            "gemma3.gemma3_decoder_block",
            "qwen.qwen_decoder",
            "qwen_moe.qwen_moe_decoder",
            "qwen3.qwen3_decoder",
            "qwen3_moe.qwen3_moe_decoder",
            "phi3.phi3_decoder",
            "falcon.falcon_transformer_decoder",
            "bloom.bloom_decoder",
            "gpt_neo_x.gpt_neo_x_decoder",
            "gpt_oss.gpt_oss_decoder",
        )
    ),
)
_LEAN = "lean_loading._build_and_fill: a model built from its config, filled from the archive"

INTERNALS = (
    # Swapped for one trace, conversion or load.
    Internal(
        "keras.src.backend.tensorflow.nn",
        "_dot_product_attention_xla",
        _KERAS,
        "tracing._attention_for_onnx: attention as one MatMul/Softmax/MatMul chain",
    ),
    Internal(
        "keras.src.backend.tensorflow.math",
        "fft2",
        _KERAS,
        "tracing._fourier_transforms_as_products: FNet's FFT as products with DFT tables",
    ),
    Internal(
        "keras.src.backend.tensorflow.nn",
        "conv",
        _KERAS,
        "tracing._grouped_convs_without_xla: a grouped convolution traced as Conv2D, not XLA",
    ),
    Internal(
        "keras.src.backend.tensorflow.nn",
        "_convert_data_format",
        _KERAS,
        "tracing._grouped_convs_without_xla: Keras' data format as TensorFlow names it",
        swapped=False,
    ),
    Internal(
        "keras.src.ops.image",
        "resize",
        _KERAS,
        "tracing._resizes_to_traced_sizes: a resize to tensor sides, past the Python size check",
    ),
    Internal(
        "keras.src.ops.image",
        "_resize",
        _KERAS,
        "tracing._resizes_to_traced_sizes: the resize Keras runs after its checks",
        swapped=False,
    ),
    Internal(
        "keras_hub.src.models.qwen3_5.qwen3_5_gated_delta_net",
        "_chunk_gated_delta_rule",
        _KERAS_HUB,
        "sequence_loops: Qwen3.5's chunked delta rule with its chunk loop as a while_loop",
    ),
    Internal(
        "keras_hub.src.models.qwen3_5.qwen3_5_gated_delta_net",
        "_l2norm",
        _KERAS_HUB,
        "sequence_loops: the normalisation keras-hub's delta rule applies first",
        swapped=False,
    ),
    Internal(
        "keras_hub.src.models.rwkv7.rwkv7_layer",
        "rnn_generalized_delta_rule",
        _KERAS_HUB,
        "sequence_loops: RWKV-7's delta rule with its step loop as a while_loop (each "
        "RWKV7TimeMix keeps it on itself, RWKV7_OP*, and calls it through a forwarder "
        "for one trace)",
    ),
    Internal(
        "keras_hub.src.models.rwkv7.rwkv7_layer",
        "transpose_head",
        _KERAS_HUB,
        "sequence_loops: the head transpose keras-hub's RWKV-7 rule applies first",
        swapped=False,
    ),
    Internal(
        "keras.src.backend.tensorflow.numpy",
        "einsum",
        _KERAS,
        "tracing._einsums_for_onnx: grouped-query einsums as transposes and one MatMul",
    ),
    Internal(
        "keras.src.ops.function",
        "Function._run_through_graph",
        _KERAS,
        "lean_reference.intermediates_freed: the validation's Keras outputs with each layer's "
        "output freed after its last reader (it also reads the instance's `_nodes_by_depth` "
        "and `_outputs_struct`)",
    ),
    Internal(
        "keras.src.ops.function",
        "Function._get_operation_for_node",
        _KERAS,
        "lean_reference.run_through_graph: the operation Keras runs for a node",
        swapped=False,
    ),
    Internal(
        "keras.src.backend.tensorflow.core",
        "slice_update",
        _KERAS,
        "causal_lm._cache_writes_as_appends: a cache update appended, not written in place",
    ),
    Internal(
        "keras.src.backend.tensorflow.core",
        "Variable._initialize_with_initializer",
        _KERAS,
        "lean_loading._deferred_variables: no initial value for weights the archive fills",
    ),
    Internal(
        "keras.src.backend.tensorflow.core",
        "Variable.assign",
        _KERAS,
        "lean_loading._assign_creates: a deferred variable is made over its stored value's buffer",
    ),
    Internal(
        "keras.src.backend.tensorflow.core",
        "Variable._direct_assign",
        _KERAS,
        "lean_loading._assign_creates: a deferred variable is created from its stored value",
    ),
    Internal(
        "onnxslim.third_party.onnx_graphsurgeon.ir.graph",
        "Graph._get_used_node_ids",
        "onnxslim 0.1.80-0.1.98",
        "onnxslim_pass._slim: cleanup asks whether each graph input is used by name, not by a "
        "scan of every used tensor",
    ),
    Internal(
        "tf2onnx.tf_loader",
        "tflist_to_onnx",
        "tf2onnx 1.16-1.17",
        "converting._branch_input_shapes: an If's branches get the shapes of its arguments",
    ),
    Internal(
        "tf2onnx.tf_loader",
        "function_def_to_graph",
        "tf2onnx 1.16-1.17 (TensorFlow's, imported there)",
        "converting._branch_input_shapes: a branch's given shapes win over Grappler's unknown ones",
    ),
    Internal(
        "tensorflow.python.grappler.tf_optimizer",
        "OptimizeGraph",
        "tensorflow 2.16-2.21",
        "converting._grappler_without_placeholder_shapes: no zero-filled copy of each weight",
    ),
    Internal(
        "numpy",
        "product",
        "numpy 2.0-2.4 (removed there; tf2onnx 1.16-1.17 still calls it)",
        "converting._numpy_product_alias: np.product as np.prod during one conversion",
        added=True,
    ),
    Internal(
        "keras_hub.src.layers.modeling.rotary_embedding",
        "RotaryEmbedding.call",
        _KERAS_HUB,
        _PADDING,
    ),
    Internal(
        "keras_hub.src.layers.modeling.position_embedding",
        "PositionEmbedding.call",
        _KERAS_HUB,
        _PADDING,
    ),
    *(
        Internal(f"keras_hub.src.{module}", "compute_causal_mask", _KERAS_HUB, _PADDING)
        for module in CAUSAL_MASK_USERS
    ),
    Internal(
        "os",
        "_exit",
        "Python 3.11-3.13",
        "loading._process_exit_refused: a user module that calls os._exit while it is "
        "imported is a usage error, not a command that ends with its exit status",
    ),
    # Read or called, never replaced.
    Internal(
        "keras.src.backend.tensorflow.nn",
        "_apply_masks",
        _KERAS,
        "tracing._attention_for_onnx: Keras' own masking inside the replacement",
        swapped=False,
    ),
    Internal(
        "keras.src.backend.tensorflow.nn",
        "_get_large_negative",
        _KERAS,
        "tracing._attention_for_onnx: Keras' own fill value for masked logits",
        swapped=False,
    ),
    Internal(_SAVING, "_model_from_config", _KERAS, _LEAN, swapped=False),
    Internal(_SAVING, "_load_state", _KERAS, _LEAN, swapped=False),
    Internal(_SAVING, "_raise_loading_failure", _KERAS, _LEAN, swapped=False),
    Internal(_SAVING, "H5IOStore", _KERAS, _LEAN, swapped=False),
    Internal(_SAVING, "safe_get_h5_dataset", _KERAS, _LEAN, swapped=False),
    Internal(
        "keras.src.backend.tensorflow.core",
        "Variable._initialize",
        _KERAS,
        "lean_loading._assign_creates: a variable created from a value",
        swapped=False,
    ),
    Internal(
        "keras.src.layers.layer",
        "Layer._flatten_layers",
        _KERAS,
        "loading and inputs: every layer of a model, nested ones included",
        swapped=False,
    ),
    # Called or overridden by a subclass of ours, never replaced.
    *(
        Internal(
            "tf2onnx.optimizer.transpose_optimizer",
            f"TransposeOptimizer.{name}",
            "tf2onnx 1.16-1.17",
            "conv_layout._layout_optimizer: tf2onnx's TransposeOptimizer with handlers of ours",
            swapped=False,
        )
        for name in (
            "_initialize_handlers",
            "_simple_through_handler",
            "_handle_node_having_branches",
            "_mul_handler",
            "_reduce_handler",
            "_reducesum_handler",
            "_switch_transpose_and_node",
            "_output_node_has_single_consumer_node",
        )
    ),
    Internal(
        "tf2onnx.optimizer",
        "_get_optimizers",
        "tf2onnx 1.16-1.17",
        "converting._optimizers: tf2onnx's optimizers, its TransposeOptimizer without the "
        "Transpose-to-Reshape step that reads stale shapes",
        swapped=False,
    ),
)


def _listed(owner, name: str) -> Internal:
    module = getattr(owner, "__module__", None) if isinstance(owner, type) else None
    module = module or getattr(owner, "__name__", "")
    for internal in INTERNALS:
        if internal.swapped and internal.name == name and _same_owner(internal, owner):
            return internal
    raise LookupError(
        f"{module}.{name} is not listed as swapped in keras_layers.export.compat.INTERNALS: "
        "list it there, with the versions it was written for, before patching it"
    )


def _same_owner(internal: Internal, owner) -> bool:
    try:
        return internal.owner() is owner
    except (ImportError, AttributeError):
        return False


class _Swap:
    """One swapped attribute: the original, and each thread's replacements.

    The attribute holds `dispatch` while any thread is inside a `patched`
    block for it; `dispatch` calls the innermost replacement of the calling
    thread, or the original when that thread has none.
    """

    def __init__(self, owner, name: str):
        self.owner, self.name = owner, name
        # A class's own entry only: an inherited method is restored by deleting.
        if isinstance(owner, type):
            self.original = owner.__dict__.get(name, _MISSING)
        else:
            self.original = getattr(owner, name, _MISSING)
        if self.original is not _MISSING and not _plain_callable(self.original):
            raise TypeError(f"{name} is not a plain function; patched swaps functions only")
        self.blocks = 0  # open blocks, all threads together
        self.local = threading.local()
        swap = self

        def dispatch(*args, **kwargs):
            replacements = getattr(swap.local, "stack", None)
            target = replacements[-1] if replacements else swap.fallback()
            return target(*args, **kwargs)

        dispatch.__name__ = dispatch.__qualname__ = name
        self.dispatch = dispatch

    def fallback(self) -> Callable:
        """What a thread without a replacement calls: the original, or what
        the class inherits."""
        if self.original is not _MISSING:
            return self.original
        if isinstance(self.owner, type):
            for base in self.owner.__mro__[1:]:
                if self.name in base.__dict__:
                    return base.__dict__[self.name]
        raise AttributeError(f"{self.owner!r} has no attribute {self.name!r}")

    def restore(self) -> None:
        if self.original is _MISSING:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.original)


def _plain_callable(value) -> bool:
    return callable(value) and not isinstance(value, staticmethod | classmethod)


_swaps: dict[tuple[int, str], _Swap] = {}
_swaps_lock = threading.Lock()


def original(owner, name: str, default=_MISSING):
    """`owner.name` as it is outside every `patched` block (a replacement
    calls this to reach the function it wraps, even while another thread's
    swap is in place).

    Args:
        owner: a module or class.
        name: the attribute.
        default: returned when there is no such attribute (else AttributeError).

    Returns:
        The attribute, or `default`.
    """
    with _swaps_lock:
        swap = _swaps.get((id(owner), name))
    if swap is None:
        return getattr(owner, name) if default is _MISSING else getattr(owner, name, default)
    try:
        return swap.fallback()
    except AttributeError:
        if default is _MISSING:
            raise
        return default


@contextmanager
def patched(owner, name: str, value) -> Iterator[None]:
    """Make `owner.name` call `value` in this thread for the block; other
    threads keep calling the original. Put back what was there after it.

    Args:
        owner: a module or class of another library.
        name: the attribute, a function, which must be listed in `INTERNALS`.
        value: what this thread calls for the length of the block.

    Raises:
        LookupError: `owner.name` is not listed in `INTERNALS`.

    An attribute that was missing before the block is deleted after the last
    block ends; another thread calling it meanwhile gets an AttributeError.
    """
    _listed(owner, name)
    key = (id(owner), name)
    with _swaps_lock:
        swap = _swaps.get(key)
        if swap is None:
            swap = _swaps[key] = _Swap(owner, name)
            setattr(owner, name, swap.dispatch)
        swap.blocks += 1
    stack = swap.local.__dict__.setdefault("stack", [])
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()
        with _swaps_lock:
            swap.blocks -= 1
            if swap.blocks == 0:
                del _swaps[key]
                swap.restore()
