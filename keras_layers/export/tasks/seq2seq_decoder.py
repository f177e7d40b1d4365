"""An encoder-decoder's decoder, one step per call, as one file (`seq2seq`).

One file of the multi-file seq2seq export: `input_ids`, the encoder's
padding mask, the decoder's past keys and values (growing) and the encoder's
(computed once, by the encoder's file) in; the logits and the present
decoder keys and values out. Checked by Keras' own cached calls over a
prompt and teacher-forced steps (`seq2seq.validate_decoder`).
"""

from pathlib import Path

from keras_layers.export import seq2seq
from keras_layers.export.errors import UsageError, argument
from keras_layers.export.loading import LoadedModel
from keras_layers.export.options import ExportOptions
from keras_layers.export.tasks.base import Checks, Stepwise
from keras_layers.export.tracing import TracedModel
from keras_layers.export.validating import Validation


class Seq2SeqDecoder(Stepwise):
    """The decoder with its caches; `describe` reads the model's sizes."""

    name = "seq2seq-decoder"

    def __init__(self) -> None:
        self.description: seq2seq.Seq2Seq | None = None

    def check(self, options: ExportOptions) -> None:
        """Refuse a grid of shapes and int8 (the decoder's checks are steps).

        Raises:
            UsageError: `shapes` or `quantize` is set.
        """
        for name in ("shapes", "quantize"):
            if getattr(options, name) is not None:
                raise UsageError(
                    f"{argument(name, getattr(options, name))}: an encoder-decoder's decoder is "
                    "checked by decode steps against Keras' cached calls: leave it out"
                )

    def describe(self, loaded: LoadedModel) -> tuple[list, list]:
        """`seq2seq.decoder_inputs` and `decoder_outputs`.

        Raises:
            UsageError: the model does not follow the `Seq2SeqLM` protocol.
        """
        self.description = seq2seq.describe(loaded.model)
        return seq2seq.decoder_inputs(self.description), seq2seq.decoder_outputs(self.description)

    def trace(self, loaded: LoadedModel) -> TracedModel:
        """`seq2seq.trace_decoder`: one cached step, the self-attention caches growing."""
        return seq2seq.trace_decoder(loaded, self.description)

    def references(self, loaded: LoadedModel, grid: None, ahead: bool):
        """`seq2seq.decoder_references`, always ahead of ONNX Runtime.

        Args:
            loaded: the loaded model.
            grid: `None`.
            ahead: (computed ahead either way).

        Returns:
            Keras' cached calls: the fed tokens, the encoder's keys and
            values, and each call's logits.
        """
        del grid, ahead
        return seq2seq.decoder_references(loaded.model, self.description)

    def validate(self, loaded: LoadedModel, onnx_path: Path, checks: Checks) -> Validation:
        """`seq2seq.validate_decoder`: the file from an empty past, step by step.

        Args:
            loaded: (unused: Keras ran in `references`).
            onnx_path: the decoder's file.
            checks: `references`' cached calls, and the tolerances.

        Returns:
            Two checks: the prompt's logits, then the decode steps' together.
        """
        del loaded
        return seq2seq.validate_decoder(
            checks.references, onnx_path, checks.atol, checks.rtol, checks.lean_memory
        )
