"""`task="causal-lm"`: a decoder with its key/value cache, checked by generating.

The file takes `input_ids` and the past caches and returns the logits and the
present caches, one call per prompt or new token, for
`keras_layers.export.generate`. `keras_layers.export.causal_lm` says which
models can (keras-hub's `CausalLM` protocol), traces them and checks a prompt,
decode steps and greedy generation against Keras; this module plugs it into
the pipeline. The grid of the forward pass does not apply, nor (yet) int8.
"""

from pathlib import Path

from keras_layers.export import causal_lm
from keras_layers.export.errors import UsageError, argument
from keras_layers.export.loading import LoadedModel
from keras_layers.export.options import ExportOptions
from keras_layers.export.tasks.base import Checks, Stepwise
from keras_layers.export.tracing import TracedModel
from keras_layers.export.validating import Validation


class CausalLm(Stepwise):
    """The decoder with its cache; `describe` reads the cache's layout, which
    the later stages use."""

    name = "causal-lm"

    def __init__(self) -> None:
        self.decoder: causal_lm.Decoder | None = None

    def check(self, options: ExportOptions) -> None:
        """Refuse a grid of shapes and int8 quantization.

        Args:
            options: the export's options.

        Raises:
            UsageError: `shapes` or `quantize` is set.
        """
        if options.shapes is not None:
            raise UsageError(
                f"{argument('shapes', options.shapes)}: a grid of shapes checks the forward "
                "pass; --task causal-lm checks a prompt, decode steps and greedy generation "
                "instead (keras_layers.export.causal_lm): leave the shapes out"
            )
        if options.quantize is not None:
            raise UsageError(
                f"{argument('quantize', options.quantize)}: a decoder is quantized into the "
                "onnxruntime-genai folder, where its gate runs: give -o FOLDER/ (a path "
                "ending in /) with --task causal-lm"
            )

    def describe(self, loaded: LoadedModel) -> tuple[list, list]:
        """`input_ids` and the past caches in; the logits and the present caches out.

        Args:
            loaded: the loaded model.

        Returns:
            The file's `(inputs, outputs)`.

        Raises:
            UsageError: the model does not follow the `CausalLM` protocol.
        """
        self.decoder = causal_lm.describe(loaded)
        return self.decoder.inputs(), self.decoder.outputs()

    def trace(self, loaded: LoadedModel) -> TracedModel:
        """`causal_lm.trace`: one cached call, the caches growing by the new tokens."""
        return causal_lm.trace(loaded, self.decoder)

    def references(self, loaded: LoadedModel, grid: None, ahead: bool) -> causal_lm.Reference:
        """`causal_lm.references`: always ahead of ONNX Runtime.

        Args:
            loaded: the loaded model.
            grid: `None`.
            ahead: (computed ahead either way).

        Returns:
            Keras' logits and greedy tokens.

        Raises:
            UsageError: the model holds too few positions for the checks.
        """
        del grid, ahead
        return causal_lm.references(loaded, self.decoder)

    def validate(self, loaded: LoadedModel, onnx_path: Path, checks: Checks) -> Validation:
        """`causal_lm.validate`: the file run as `generate` runs it.

        Args:
            loaded: the loaded model (not run again).
            onnx_path: the file to check.
            checks: Keras' side (`references`) and the tolerances.

        Returns:
            The prompt's check, the decode steps' and one per greedy batch.
        """
        del loaded
        return causal_lm.validate(
            checks.references,
            onnx_path,
            checks.atol,
            checks.rtol,
            checks.on_step,
            lean_memory=checks.lean_memory,
        )
