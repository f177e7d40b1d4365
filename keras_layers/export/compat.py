"""The one place where the export touches other libraries' internals.

Every attribute of Keras, TensorFlow or NumPy that the export swaps for the
length of one call is listed in `INTERNALS`, with the versions it was written
for and why, and swapped only through `patched`, which puts the original back
whatever happens. `tests/test_compat.py` checks that each listed attribute
still exists in the versions installed, so an upgrade that removes one fails
loudly in the tests instead of silently changing an export.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import import_module

_MISSING = object()


@dataclass(frozen=True)
class Internal:
    """One attribute of another library that the export swaps.

    Attributes:
        module: the module that holds it, or holds the class that does.
        path: the attribute, dotted from the module (`"KerasVariable._direct_assign"`).
        written_for: the library and versions the replacement was written against.
        user: the function of ours that swaps it, and why.
        may_be_absent: True when the swap is skipped where the attribute is missing
            (an optional fast path), False when the export needs it.
    """

    module: str
    path: str
    written_for: str
    user: str
    may_be_absent: bool = False

    def owner(self):
        """The object whose attribute is swapped (imports its module)."""
        owner = import_module(self.module)
        for part in self.path.split(".")[:-1]:
            owner = getattr(owner, part)
        return owner

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


INTERNALS = (
    Internal(
        "keras.src.backend.tensorflow.nn",
        "_dot_product_attention_xla",
        "keras 3.5-3.15",
        "tracing._attention_for_onnx: attention as one MatMul/Softmax/MatMul chain",
    ),
    Internal(
        "keras.src.backend.tensorflow.numpy",
        "einsum",
        "keras 3.5-3.15",
        "tracing._einsums_for_onnx: grouped-query einsums as transposes and one MatMul",
    ),
    Internal(
        "keras.src.backend.tensorflow.core",
        "slice_update",
        "keras 3.5-3.15",
        "causal_lm: a cache update appended instead of written in place",
    ),
    Internal(
        "keras.src.backend.tensorflow.core",
        "Variable._initialize_with_initializer",
        "keras 3.5-3.15",
        "lean_loading._deferred_variables: no initial value for weights the archive fills",
    ),
    Internal(
        "keras.src.backend.tensorflow.core",
        "Variable._direct_assign",
        "keras 3.5-3.15",
        "lean_loading._assign_creates: a deferred variable is created from its stored value",
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
        may_be_absent=True,
    ),
)


def _listed(owner, name: str) -> Internal:
    module = getattr(owner, "__module__", None) if isinstance(owner, type) else None
    module = module or getattr(owner, "__name__", "")
    for internal in INTERNALS:
        if internal.name == name and _same_owner(internal, owner, module):
            return internal
    raise LookupError(
        f"{module}.{name} is not in keras_layers.export.compat.INTERNALS: list it there, "
        "with the versions it was written for, before patching it"
    )


def _same_owner(internal: Internal, owner, module: str) -> bool:
    try:
        return internal.owner() is owner
    except (ImportError, AttributeError):
        return False


@contextmanager
def patched(owner, name: str, value) -> Iterator[None]:
    """Set `owner.name = value` for the block; put back what was there after it.

    Args:
        owner: a module or class of another library.
        name: the attribute, which must be listed in `INTERNALS`.
        value: what it is for the length of the block.

    Raises:
        LookupError: `owner.name` is not listed in `INTERNALS`.

    An attribute that was missing before the block is deleted after it.
    """
    _listed(owner, name)
    # A class's own entry only: an inherited method is restored by deleting.
    if isinstance(owner, type):
        original = owner.__dict__.get(name, _MISSING)
    else:
        original = getattr(owner, name, _MISSING)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if original is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
