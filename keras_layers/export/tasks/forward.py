"""`task="forward"`: the model's own call over whole sequences, checked over a grid.

The file takes the model's inputs and returns its outputs (`tracing.trace`);
the checks feed both the same generated inputs at every point of a grid of
batch sizes and sequence lengths, plus a right-padded batch when the model
masks padding (`validating`).
"""

from dataclasses import replace
from pathlib import Path

from keras_layers.export import detections, tracing, validating
from keras_layers.export.errors import UsageError, argument
from keras_layers.export.loading import LoadedModel
from keras_layers.export.options import ExportOptions
from keras_layers.export.tasks.base import Checks
from keras_layers.export.tracing import TracedModel
from keras_layers.export.validating import Validation


class Forward:
    """The forward pass: every option applies; the grid is the check."""

    name = "forward"

    def __init__(self) -> None:
        # Whether an int8 copy is judged on the grid too (`check` reads it).
        self.int8 = False

    def check(self, options: ExportOptions) -> None:
        """Refuse int4: weight-only 4 bits is for decoders, in their folder.
        Note whether an int8 copy is judged on the grid (`grid`).

        Args:
            options: the export's options.

        Raises:
            UsageError: `quantize` is "int4".
        """
        self.int8 = options.quantize == "int8"
        if options.quantize == "int4":
            raise UsageError(
                f"{argument('quantize', options.quantize)}: 4-bit weights are for decoders, "
                "written into the onnxruntime-genai folder (task causal-lm, a folder output "
                "ending in /); for this model int8 is the quantization"
            )

    def describe(self, loaded: LoadedModel) -> tuple[list, list]:
        """The model's own inputs, independent sequences on axes of their own
        (`validating.split_sequence_axes`), and its outputs, each axis named
        after the input axis it follows (`validating.name_output_axes`).
        Sets `loaded.image_sides` (`validating.image_sides`), the text's
        `loaded.max_length` where Keras says otherwise (`validating.text_bound`),
        `loaded.min_length` (`validating.shortest_length`) and
        `loaded.min_samples` (`validating.fewest_samples`) first, which the
        runs behind both, and the grid, start from; and the default lengths
        Keras itself fails on (`validating.refused_lengths`), said in the
        report.

        Args:
            loaded: the loaded model.

        Returns:
            `(inputs, outputs)`.
        """
        loaded.image_sides = validating.image_sides(loaded)
        bound = validating.text_bound(loaded)
        if bound is not None:
            loaded.max_length, loaded.max_length_source, note = bound
            loaded.notes.append(note)
        loaded.min_length = validating.shortest_length(loaded)
        loaded.min_samples = validating.fewest_samples(loaded)
        loaded.refused_lengths = validating.refused_lengths(loaded)
        note = validating.refused_note(loaded)
        loaded.notes += [note] if note else []
        inputs = validating.split_sequence_axes(loaded)
        return inputs, validating.name_output_axes(replace(loaded, inputs=inputs))

    def trace(self, loaded: LoadedModel) -> TracedModel:
        """`tracing.trace`: the model's call, its weights as inputs."""
        return tracing.trace(loaded)

    def grid(self, loaded: LoadedModel, shapes: list | None) -> list:
        """The caller's grid, checked against the model's position tables, or
        `validating.default_shapes` (with the rows the int8 gate needs, when
        `check` saw int8 asked).

        Args:
            loaded: the loaded model.
            shapes: the caller's grid, or `None`.

        Returns:
            The grid to check.

        Raises:
            UsageError: a grid point is longer than the model allows.
        """
        if shapes is None:
            return validating.default_shapes(loaded, self.int8)
        validating.check_shapes_fit(loaded, shapes)
        return shapes

    def references(self, loaded: LoadedModel, grid: list, ahead: bool) -> list | None:
        """Keras' outputs over the whole grid when they must come `ahead`;
        otherwise `None`, and `validate` runs Keras one point at a time.

        Args:
            loaded: the loaded model.
            grid: the grid.
            ahead: the model is released next.

        Returns:
            `validating.Reference`s, or `None`.
        """
        return list(validating.keras_references(loaded, grid)) if ahead else None

    def validate(self, loaded: LoadedModel, onnx_path: Path, checks: Checks) -> Validation:
        """`validating.validate` over the grid; a detector's detections too,
        both sides decoded by its own decoder (`detections`).

        Args:
            loaded: the loaded model.
            onnx_path: the file to check.
            checks: the grid, Keras' side and the tolerances.

        Returns:
            One check per output and grid point.
        """
        atol, rtol = checks.atol, checks.rtol
        return validating.validate(
            loaded,
            onnx_path,
            checks.grid,
            atol,
            rtol,
            checks.on_step,
            quantized=checks.quantized,
            allow_nonfinite=checks.allow_nonfinite,
            lean_memory=checks.lean_memory,
            references=checks.references,
            min_top1=checks.min_top1,
            file_names=checks.file_names,
            decode=None if checks.quantized else detections.checker(loaded, atol, rtol),
        )
