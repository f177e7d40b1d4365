"""One file per part: the pieces of a composite model that a deployment runs apart.

Some keras-hub models are one Keras model but several programs once deployed:

- **two towers** (CLIP, SigLIP, MetaCLIP 2, VideoPrism): images are embedded
  once, offline, and texts per query, so an image embedder and a text
  embedder run apart; the model says so by offering `get_vision_embeddings`
  and `get_text_embeddings`;
- **a promptable segmenter** (SAM): the image encoder runs once per image,
  the prompt encoder and mask decoder once per click; the model holds an
  `image_encoder` sub-model, a `prompt_encoder` and (a task) a `mask_decoder`;
- **latent diffusion** (Stable Diffusion 3): the text encoders once per
  prompt, the denoiser once per step (the scheduler between steps is a few
  lines of NumPy), the VAE's decoder once per image, as optimum's Stable
  Diffusion files are split; the model holds a `diffuser` sub-model and
  says how its steps run (`encode_text_step`, `encode_image_step`,
  `decode_step`), and its text inputs are named `<encoder>_token_ids` and
  `<encoder>_negative_token_ids`.

`find_parts` reads which of these a model is from what it holds (the
methods and sub-models above, never its class name) and builds each part as
a functional Keras model on the model's own layers: the same weights, the
same computation, the model's own input names. `export_parts` exports each
one through the forward pipeline, so each is converted, made lean and
proved against Keras on its own grid, then places the files as one set
(`folder_placement`): `FOLDER/<part>.onnx` and `FOLDER/report.json`.

SAM's prompt decoder is exported without mask prompts: keras-hub's prompt
encoder chooses between "no mask" and "embed these masks" with a `cond` on
the masks' count, which tf2onnx converts into an `If` it cannot convert
(the whole model fails so). Without masks the choice is made when tracing.
Points, labels and boxes are drawn as prompts (`keras_layers.export.prompts`).
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from keras_layers.export import folder_placement, loading, pipeline, placement
from keras_layers.export.errors import ExportError, UsageError, ValidationFailed, argument
from keras_layers.export.options import ExportOptions

REPORT_FILE = "report.json"
# The model's names for an image input, by the towers' parameter names.
_IMAGE_PARAMETERS = ("images", "pixel_values")


@dataclass(frozen=True)
class Part:
    """One part of a composite model.

    Attributes:
        name: the file's name, without `.onnx` (`vision_embedder`).
        model: a functional Keras model on the composite's own layers.
        what: one line saying what it computes, for the report.
    """

    name: str
    model: object
    what: str


def _inputs_by_name(model) -> dict:
    """The model's symbolic inputs, by name."""
    import keras

    return {tensor.name: tensor for tensor in keras.tree.flatten(model.input)}


def _tower(model, method: str, inputs: dict):
    """A functional model of `model.<method>` on the model's own inputs, named
    as the method's parameters are; `None` when an input is missing."""
    import keras

    parameters = list(inspect.signature(getattr(model, method)).parameters)
    taken = []
    for parameter in parameters:
        tensor = inputs.get(parameter)
        if tensor is None and parameter in _IMAGE_PARAMETERS:
            tensor = next((inputs[n] for n in _IMAGE_PARAMETERS if n in inputs), None)
        if tensor is None:
            return None
        taken.append(tensor)
    outputs = getattr(model, method)(*taken)
    return keras.Model(dict(zip(parameters, taken, strict=True)), outputs, name=method)


def _two_towers(model) -> list[Part]:
    if not all(hasattr(model, m) for m in ("get_vision_embeddings", "get_text_embeddings")):
        return []
    inputs = _inputs_by_name(model)
    vision = _tower(model, "get_vision_embeddings", inputs)
    text = _tower(model, "get_text_embeddings", inputs)
    if vision is None or text is None:  # built with one tower only (VideoPrism's vision)
        return []
    return [
        Part("vision_embedder", vision, "images to their embeddings (get_vision_embeddings)"),
        Part("text_embedder", text, "token ids to their embeddings (get_text_embeddings)"),
    ]


def _promptable(model) -> list[Part]:
    import keras

    backbone = getattr(model, "backbone", model)
    encoder = getattr(backbone, "image_encoder", None)
    prompt_encoder = getattr(backbone, "prompt_encoder", None)
    if not isinstance(encoder, keras.Model) or prompt_encoder is None:
        return []
    inputs = _inputs_by_name(backbone)
    prompts = {n: inputs[n] for n in ("points", "labels", "boxes") if n in inputs}
    if not prompts:
        return []
    embeddings = keras.Input(
        batch_shape=tuple(encoder.output.shape), dtype=encoder.output.dtype, name="image_embeddings"
    )
    embedded = prompt_encoder(**prompts)
    decoder = getattr(backbone, "mask_decoder", None)
    if model is not backbone and decoder is not None:  # the task decodes masks
        name, what = "prompt_decoder", "image embeddings and prompts to masks and their scores"
        outputs = decoder(image_embeddings=embeddings, **embedded)
        part_inputs = {"image_embeddings": embeddings, **prompts}
    else:
        name, what = "prompt_encoder", "prompts to their embeddings"
        outputs, part_inputs = embedded, prompts
    return [
        Part("image_encoder", encoder, "images to their embeddings (image_encoder)"),
        Part(name, keras.Model(part_inputs, outputs, name=name), what + " (no mask prompts)"),
    ]


def _diffusion(model) -> list[Part]:
    import keras

    backbone = getattr(model, "backbone", model)
    steps = ("encode_text_step", "encode_image_step", "decode_step")
    diffuser = getattr(backbone, "diffuser", None)
    if not isinstance(diffuser, keras.Model) or not all(hasattr(backbone, m) for m in steps):
        return []
    inputs = _inputs_by_name(backbone)
    encoders = [key[: -len("_token_ids")] for key in inputs if key.endswith("_token_ids")]
    encoders = [key for key in encoders if not key.endswith("_negative")]
    texts = {
        side: {key: inputs[f"{key}{infix}_token_ids"] for key in encoders}
        for side, infix in (("positive", ""), ("negative", "_negative"))
    }
    images, latents = inputs.get("images"), inputs.get("latents")
    if not encoders or images is None or latents is None:
        return []
    embedded = backbone.encode_text_step(texts["positive"], texts["negative"])
    names = ("embeddings", "negative_embeddings", "pooled_embeddings", "negative_pooled_embeddings")
    text_inputs = {t.name: t for side in texts.values() for t in side.values()}
    fresh = keras.Input(batch_shape=tuple(latents.shape), dtype=latents.dtype, name="latents")
    return [
        Part(
            "text_encoder",
            keras.Model(text_inputs, dict(zip(names, embedded, strict=True)), name="text_encoder"),
            "token ids and negative token ids to the diffuser's context (encode_text_step)",
        ),
        Part("diffuser", diffuser, "latents, context, pooled projection and timestep to noise"),
        Part(
            "vae_decoder",
            keras.Model(fresh, backbone.decode_step(fresh), name="vae_decoder"),
            "latents to images (decode_step)",
        ),
        Part(
            "vae_encoder",
            keras.Model(images, backbone.encode_image_step(images), name="vae_encoder"),
            "images to latents (encode_image_step)",
        ),
    ]


# How a composite is split, tried in order: each returns its parts, or []
# when the model is not of its kind.
RECIPES: tuple[Callable[[object], list[Part]], ...] = (_two_towers, _promptable, _diffusion)


def find_parts(model) -> list[Part]:
    """The parts a deployment runs apart, read from what the model holds.

    Args:
        model: a Keras model (a keras-hub backbone or task).

    Returns:
        The parts (`RECIPES`), or `[]` when the model is no composite these know.

    Example:

    >>> import keras
    >>> from keras_layers.export.parts import find_parts
    >>> inputs = keras.Input((4,))
    >>> find_parts(keras.Model(inputs, keras.layers.Dense(2)(inputs)))  # one piece
    []

    `export_parts`' example splits a SigLIP into its two towers.
    """
    for recipe in RECIPES:
        found = recipe(model)
        if found:
            return found
    return []


def _checked(options: ExportOptions, folder) -> tuple[ExportOptions, Path]:
    if options.report_path is not None:
        raise UsageError(
            f"{argument('report_path', options.report_path)}: not taken with parts=True; "
            f"the report is FOLDER/{REPORT_FILE}"
        )
    if not isinstance(folder, str | Path) or not str(folder):
        raise UsageError(f"{argument('output', folder)}: give the folder for the parts (FOLDER/)")
    folder = Path(folder)
    if folder.suffix == ".onnx" or folder.exists() and not folder.is_dir():
        wanted = f"{folder.with_suffix('')}/"
        raise UsageError(
            f"{argument('output', folder)}: parts=True writes one file per part into a folder; "
            f"give {argument('output', wanted)}"
        )
    return options, folder


def export_parts(model, folder, options: ExportOptions, *, progress=None) -> dict:
    """Export each part of a composite model to its own file, each proved, then placed.

    Args:
        model: a keras-hub composite (`find_parts`) in memory, or the path of
            a `.keras` file holding one.
        folder: the folder to write: `FOLDER/<part>.onnx` and
            `FOLDER/report.json`; its files are the last export's or this
            one's, never a mix (`folder_placement`), and other files in it
            are left alone.
        options: the export's `ExportOptions`, used for every part;
            `report_path` is refused.
        progress: called with a `pipeline.StageEvent` as each part's stages
            start and end.

    Returns:
        The report (also `FOLDER/report.json`): `passed`, `parts` (each
        part's name, what it computes, and its own export report).

    Raises:
        UsageError: the model has no parts known here, an option is refused,
            or `folder` is a file.
        ConversionError, ValidationFailed: a part fails, named in the
            message; nothing is placed.

    Example:

    >>> import keras_hub
    >>> from keras_layers.export import ExportOptions
    >>> from keras_layers.export.parts import export_parts
    >>> model = keras_hub.models.SigLIPBackbone(
    ...     keras_hub.models.SigLIPVisionEncoder(patch_size=4, hidden_dim=8, num_layers=1,
    ...         num_heads=2, intermediate_dim=16, image_shape=(16, 16, 3)),
    ...     keras_hub.models.SigLIPTextEncoder(vocabulary_size=32, embedding_dim=8,
    ...         hidden_dim=8, num_layers=1, num_heads=2, intermediate_dim=16,
    ...         max_sequence_length=8))
    >>> [part.name for part in find_parts(model)]
    ['vision_embedder', 'text_embedder']
    >>> report = export_parts(model, tmp / "siglip", ExportOptions(parts=True))
    >>> sorted(p.name for p in (tmp / "siglip").iterdir() if not p.name.startswith("."))
    ['report.json', 'text_embedder.onnx', 'vision_embedder.onnx']
    """
    options, folder = _checked(pipeline.checked_options(options), folder)
    if isinstance(model, str | Path):
        model = loading.load(model, imports=options.imports, unsafe=options.unsafe).model
    parts = find_parts(model)
    if not parts:
        raise UsageError(
            f"{argument('parts', True)}: {type(model).__name__} is no composite known here "
            "(two towers with get_vision_embeddings and get_text_embeddings, an image encoder "
            "with a prompt encoder, or a diffuser with its VAE); export it as one file"
        )
    suffixes = [".onnx", *([".int8.onnx"] if options.quantize else [])]
    files = [REPORT_FILE, *(part.name + suffix for part in parts for suffix in suffixes)]
    folder_placement.check_names(folder, files, [])
    reports, nothing = {}, f"Nothing was placed: {folder} is as it was."
    with folder_placement.staging(folder) as staging:
        for part in parts:
            inner = replace(options, parts=False, report_path=staging / f".{part.name}.json")
            try:
                report = pipeline.export_model(
                    part.model, staging / f"{part.name}.onnx", inner, progress=progress
                )
            except ValidationFailed as error:  # its files were staged only: say so
                message = f"part {part.name!r} ({part.what}): {error.reason}. {nothing}"
                raise ValidationFailed(message, error.report, error.reason) from error
            except ExportError as error:
                message = f"part {part.name!r} ({part.what}): {error}. {nothing}"
                raise type(error)(message) from error
            (staging / f".{part.name}.json").unlink()
            report["onnx_path"] = str(folder / f"{part.name}.onnx")
            reports[part.name] = {"what": part.what, **report}
        summary = {
            "passed": all(r["passed"] for r in reports.values()),
            "report_path": str(folder / REPORT_FILE),
            "parts": reports,
        }
        placement.write_json(summary, staging / REPORT_FILE)
        folder_placement.place_folder(staging, folder)
    return summary
