"""`keras_layers.export.export_model`: one entry for every kind of export.

The stages of each kind live in their own module; this one only picks:

- `ExportOptions(preprocessor=True)`: a keras-hub image task with its
  image converter, decoded images in (`image_model.export_image_model`), or
  a text task with its preprocessor, strings in
  (`text_model.export_text_model`);
- `ExportOptions(parts=True)`: a composite (two towers, a promptable
  segmenter, latent diffusion) as one proved file per part in a folder
  (`parts.export_parts`);
- `task="causal-lm"` with a folder output (`"FOLDER/"`, or an existing
  folder): the folder onnxruntime-genai runs (`genai_folder.export_folder`);
- `task="seq2seq-lm"`: an encoder-decoder as a folder that generates
  (`seq2seq_folder.export_folder`);
- anything else: the pipeline (`pipeline.export_model`), a file with token
  ids in.
"""

import os
from collections.abc import Callable

from keras_layers.export import (
    genai_folder,
    image_model,
    loading,
    parts,
    pipeline,
    seq2seq_folder,
    text_model,
)
from keras_layers.export.errors import UsageError, argument
from keras_layers.export.options import ExportOptions


def export_model(
    model,
    output,
    options: ExportOptions | None = None,
    *,
    task: str = "forward",
    progress: pipeline.Progress | None = None,
    evaluate: Callable | None = None,
) -> dict:
    """Export a Keras model to ONNX and prove in ONNX Runtime that it matches.

    Args:
        model: a `keras.Model` in memory, or the path of a `.keras` file.
        output: the ONNX file to write; with `task="causal-lm"`, a folder
            (`"FOLDER/"` or an existing folder) writes the folder
            onnxruntime-genai runs, and a path with neither a suffix nor a
            final separator is refused as ambiguous; with
            `ExportOptions(parts=True)`, the folder of the parts' files.
        options: an `ExportOptions` (default: every default);
            `preprocessor=True` exports a keras-hub text task with its
            preprocessor as one file that takes strings; the folder's
            settings (`sampler`, `context_length`, `end_token_id`, ...) are
            refused for any other output.
        task: `"forward"` or `"causal-lm"` (`pipeline.export_model` says what each
            exports and checks), or `"seq2seq-lm"`: an encoder-decoder (a
            keras-hub `Seq2SeqLM`) as a folder, `output` ending in `/`.
        progress: called with a `pipeline.StageEvent` as each stage starts and
            ends (the pipeline's exports).
        evaluate: a task-level check of the int8 file (`ExportOptions.quantize`).

    Returns:
        The report (a JSON-ready dict, also written beside the output, or in
        the folder): `passed`, `onnx_path`, `checks`, ...

    Raises:
        UsageError: a bad argument or input (exit code 2 on the command line).
        ConversionError: tf2onnx cannot convert the model.
        ValidationFailed: ONNX Runtime (or onnxruntime-genai) and Keras
            disagree; nothing at the output paths was changed.
    """
    options = pipeline.checked_options(options)
    if options.parts:
        if task != "forward":
            raise UsageError(
                f"{argument('parts', True)}: one file per part is a forward export; leave "
                f"task {task!r} out"
            )
        genai_folder.refuse_folder_options(options, task, output)
        return parts.export_parts(model, output, options, progress=progress)
    genai_folder.refuse_folder_options(options, task, output)
    if task == "seq2seq-lm":
        return seq2seq_folder.export_folder(model, output, options, progress=progress)
    if options.channels_first and task != "forward":
        raise UsageError(
            f"{argument('channels_first', True)}: images as NCHW are for the forward pass; "
            f"leave it out with task {task!r}"
        )
    genai_folder.refuse_ambiguous_output(task, output)
    if options.preprocessor:
        if task != "forward":
            raise UsageError(
                f"{argument('task', task)}: preprocessor=True exports the forward pass of a "
                "text task; leave task out"
            )
        if isinstance(model, str | os.PathLike):  # read once: which preprocessor it holds
            model = loading.load(model, imports=options.imports, unsafe=options.unsafe).model
        if image_model.image_converter(model) is not None:
            return image_model.export_image_model(model, output, options)
        return text_model.export_text_model(model, output, options, pairs=options.text_pairs)
    if task == "causal-lm" and genai_folder.is_folder(output):
        return genai_folder.export_folder(model, output, options, progress=progress)
    return pipeline.export_model(
        model, output, options, task=task, progress=progress, evaluate=evaluate
    )
