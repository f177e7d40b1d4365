"""Every keras-hub image, audio, video and multimodal model, built tiny and
offline: the classes the text zoo (tests/zoo_models.py) skips.

Shared by tests/test_zoo_vision.py and benchmarks/zoo_vision.py, so the tests
and the page's table are about the same models.

Enumeration (programmatic, never a hand-picked list):

- backbones: every `keras_hub.models.Backbone` subclass that the text zoo's
  rule skips (`zoo_models.enumerate_zoo`, step 1: no vocabulary argument, or a
  pre-built sub-model; step 2: a float input, `READS_MEDIA`);
- tasks: every class of `keras_hub.models` that subclasses `Task` and whose
  `backbone_cls` is one of those backbones, with `preprocessor=None`. Its
  kind is the task base it derives from (`ImageClassifier`, `ImageSegmenter`,
  `ObjectDetector`, `DepthEstimator`, `AudioToText`, `CausalLM`,
  `TextToImage`, ...): the nearest class of its MRO without a backbone.

Sizes are read off each class's `__init__` signature
(`zoo_models.tiny_arguments`, with `TINY`), and `EXTRA` holds, per class,
what is no size or what keras-hub's constructor checks (stage lists, image
shapes, patch sizes, pyramid keys), each taken from the class's docstring
example or keras-hub's own test of it, then shrunk. A composite's sub-models
are `Part`s, built tiny the same way: a CLIP from a tiny `CLIPVisionEncoder`
and `CLIPTextEncoder`, a RetinaNet or DeepLabV3 on a tiny ResNet, a SegFormer
on a tiny MiT, SAM from a ViTDet with its prompt encoder and mask decoder.
Nothing is downloaded: no `from_preset`. Weights are redrawn as the text
zoo's are (`zoo_models.redraw`: N(0, 0.2), BatchNorm variances U(0.5, 1.5)).

A class that cannot be built tiny is never skipped silently: `NOT_BUILT`
names why, and `build` raises `NotBuilt` with that reason.
"""

import importlib
import inspect
from dataclasses import dataclass, field

import zoo_models

SEED = zoo_models.SEED

# Step 2 of the text rule's outcome (zoo_models.READS_MEDIA).
READS_MEDIA = zoo_models.READS_MEDIA

# Sizes by (normalised) argument name, over the text zoo's.
TINY = {
    **zoo_models.TINY,
    "mlp_dim": 32,
    "projection_dim": 16,
    "num_mels": 8,
    "max_label_length": 8,
    "projection_filters": 8,
    "num_features": 32,  # a classifier head's width (EfficientNet, MobileNet)
    "pooling_hidden_dim": 16,  # VGG's head, 4096 by default
    "head_hidden_size": 32,  # MobileNetV5's head, 2048 by default
}


@dataclass(frozen=True)
class Part:
    """A sub-model handed to a composite's constructor, built tiny.

    `cls` is a name in `keras_hub.models`, or a dotted path below
    `keras_hub.src` for the parts keras-hub does not export; `arguments` go
    over its `EXTRA` entry and its tiny sizes.
    """

    cls: str
    arguments: dict = field(default_factory=dict)


def part(cls: str, **arguments) -> Part:
    return Part(cls, arguments)


_SAM = "keras_hub.src.models.sam."
_SAM3 = "keras_hub.src.models.sam3."
_SD3_VAE = "keras_hub.src.models.vae.vae_backbone.VAEBackbone"

# Four stages (P2..P5), the first of 64 filters as keras-hub requires, the
# rest 8: what RetinaNet, BASNet and DeepLabV3 read their pyramids from.
_RESNET = {
    "input_conv_filters": [64],
    "input_conv_kernel_sizes": [3],
    "stackwise_num_filters": [64, 8, 8, 8],
    "stackwise_num_blocks": [1, 1, 1, 1],
    "stackwise_num_strides": [1, 2, 2, 2],
    "block_type": "basic_block",
    "use_pre_activation": False,
}
_MIT = {
    "image_shape": (32, 32, 3),  # its attention's spatial reduction needs the size
    "layerwise_depths": [1, 1],
    "num_layers": 2,
    "hidden_dims": [8, 16],
    "layerwise_num_heads": [1, 2],
    "layerwise_sr_ratios": [4, 2],
    "max_drop_path_rate": 0.0,
    "layerwise_patch_sizes": [7, 3],
    "layerwise_strides": [4, 2],
}
_HGNETV2 = {
    "stem_channels": [3, 8, 8],
    "stackwise_stage_filters": [[8, 8, 16, 1, 1, 3], [16, 8, 32, 1, 1, 3]],
    "apply_downsample": [False, True],
    "use_lightweight_conv_block": [False, False],
    "depths": [1, 1],
    "hidden_sizes": [16, 32],
    "embedding_size": 8,
    "use_learnable_affine_block": True,
    "hidden_act": "relu",
}
_CLIP_TEXT = {"embedding_dim": 16, "max_sequence_length": 16}

EXTRA = {
    # --- convolutional image backbones: any image size (image_shape left free)
    "ResNetBackbone": _RESNET,
    "VGGBackbone": {"stackwise_num_repeats": [1, 1], "stackwise_num_filters": [8, 16]},
    "DenseNetBackbone": {"stackwise_num_repeats": [1, 1], "growth_rate": 4},
    # The first block as keras-hub's test has it: with 8 and 16 filters there,
    # the residual sums only line up at sides 7 to 9.
    "XceptionBackbone": {
        "stackwise_conv_filters": [[32, 64], [16, 16], [16, 16]],
        "stackwise_pooling": [False, True, False],
    },
    "CSPNetBackbone": {
        "stem_filters": 8,
        "stem_kernel_size": 3,
        "stem_strides": 1,
        "stackwise_depth": [1, 1],
        "stackwise_strides": 2,
        "stackwise_num_filters": [8, 16],
        "down_growth": True,
        "bottle_ratio": (0.5, 1.0),
        "block_ratio": (1.0, 0.5),
        "expand_ratio": (2.0, 1.0),
        "block_type": "dark_block",
        "stage_type": "csp",
        "stem_padding": "same",
    },
    "MobileNetBackbone": {
        "stackwise_expansion": [[16], [24, 24]],
        "stackwise_num_blocks": [1, 2],
        "stackwise_num_filters": [[8], [16, 16]],
        "stackwise_kernel_size": [[3], [5, 5]],
        "stackwise_num_strides": [[2], [2, 1]],
        "stackwise_se_ratio": [[None], [0.25, 0.25]],
        "stackwise_activation": [["relu"], ["hard_swish", "hard_swish"], ["hard_swish"]],
        "stackwise_padding": [[1], [2, 2]],
        "output_num_filters": 32,
        "depthwise_filters": 8,
        "depthwise_stride": 2,
        "depthwise_residual": False,
        "squeeze_and_excite": 0.5,
        "last_layer_filter": 32,
        "input_num_filters": 8,
    },
    "MobileNetV5Backbone": {
        "stackwise_block_types": [["er"], ["uir", "uir"]],
        "stackwise_num_blocks": [1, 2],
        "stackwise_num_filters": [[8], [16, 16]],
        "stackwise_strides": [[2], [2, 1]],
        "stackwise_act_layers": [["relu"], ["relu", "relu"]],
        "stackwise_exp_ratios": [[4.0], [2.0, 2.0]],
        "stackwise_se_ratios": [[0.0], [0.0, 0.0]],
        "stackwise_dw_kernel_sizes": [[0], [5, 5]],
        "stackwise_dw_start_kernel_sizes": [[0], [0, 0]],
        "stackwise_dw_end_kernel_sizes": [[0], [0, 0]],
        "stackwise_exp_kernel_sizes": [[3], [0, 0]],
        "stackwise_pw_kernel_sizes": [[1], [0, 0]],
        "stackwise_num_heads": [[0], [0, 0]],
        "stackwise_key_dims": [[0], [0, 0]],
        "stackwise_value_dims": [[0], [0, 0]],
        "stackwise_kv_strides": [[0], [0, 0]],
        "stackwise_use_cpe": [[False], [False, False]],
        "stem_size": 8,
        "use_msfa": False,
    },
    "EfficientNetBackbone": {
        "stackwise_kernel_sizes": [3, 3],
        "stackwise_num_repeats": [1, 1],
        "stackwise_input_filters": [8, 8],
        "stackwise_output_filters": [8, 16],
        "stackwise_expansion_ratios": [1, 4],
        "stackwise_squeeze_and_excite_ratios": [0.0, 0.25],
        "stackwise_strides": [1, 2],
        "stackwise_block_types": ["fused", "unfused"],
        "stackwise_force_input_filters": [0, 0],
        "stackwise_nores_option": [False, False],
        "width_coefficient": 1.0,  # **kwargs: the stackwise coefficients default to them
        "depth_coefficient": 1.0,
    },
    "HGNetV2Backbone": _HGNETV2,
    "MiTBackbone": _MIT,
    # --- transformers over patches: a fixed image size, from the docstring
    "ViTBackbone": {"image_shape": (32, 32, 3), "patch_size": 8},
    "DeiTBackbone": {"image_shape": (16, 16, 3), "patch_size": 4},
    "DINOV2Backbone": {
        "patch_size": 14,
        "image_shape": (70, 70, 3),  # 5 x 5 patches: DepthAnything's neck convolves them
        "position_embedding_shape": (70, 70, 3),
    },
    "DINOV3Backbone": {"patch_size": 16, "image_shape": (32, 32, 3)},
    "SwinTransformerBackbone": {
        "image_shape": (32, 32, 3),
        "embed_dim": 8,
        "depths": (2, 2),
        "num_heads": (1, 2),
        "window_size": 4,
    },
    "ViTDetBackbone": {
        "image_shape": (16, 16, 3),
        "patch_size": 2,
        "global_attention_layer_indices": [1],
        "num_output_channels": 8,
        "window_size": 2,
    },
    "CLIPVisionEncoder": {"image_shape": (16, 16, 3)},
    "SigLIPVisionEncoder": {"image_shape": (16, 16, 3)},
    "MetaCLIP2VisionEncoder": {"image_shape": (16, 16, 3)},
    # --- audio and video
    "VideoPrismBackbone": zoo_models.EXTRA["VideoPrismBackbone"],
    "WhisperBackbone": {"max_encoder_sequence_length": 64, "max_decoder_sequence_length": 32},
    # --- composites: sub-models built tiny
    "CLIPBackbone": {
        "vision_encoder": part("CLIPVisionEncoder"),
        "text_encoder": part("CLIPTextEncoder", **_CLIP_TEXT),
    },
    "MetaCLIP2Backbone": {
        "vision_encoder": part("MetaCLIP2VisionEncoder"),
        "text_encoder": part("MetaCLIP2TextEncoder", **_CLIP_TEXT),
    },
    "SigLIPBackbone": {
        "vision_encoder": part("SigLIPVisionEncoder"),
        "text_encoder": part("SigLIPTextEncoder", **_CLIP_TEXT),
    },
    # Its encoder's first block reads the projection: as many filters as ResNet's stem.
    # 64 projection filters (its first layer feeds the ResNet's 64-filter
    # stage) make a decoder of 512 channels at full resolution; at free sides
    # the grid's 96 x 96 images took 78 s to validate, at this fixed size a
    # few seconds (DeepLabV3 has free sides through its bilinear upsampling).
    "BASNetBackbone": {
        "image_encoder": part("ResNetBackbone"),
        "projection_filters": 64,
        "image_shape": (32, 32, 3),
    },
    "RetinaNetBackbone": {
        "image_encoder": part("ResNetBackbone"),
        "min_level": 3,
        "max_level": 5,
        "use_p5": False,
    },
    "DeepLabV3Backbone": {
        "image_encoder": part("ResNetBackbone"),
        "low_level_feature_key": "P2",
        "spatial_pyramid_pooling_key": "P4",
        "dilation_rates": [2, 4],
        "upsampling_size": 4,
        # Free sides: its bilinear `UpSampling2D` resizes to tensor sizes,
        # which the trace takes past Keras' Python check of the size
        # (`tracing._resizes_to_traced_sizes`; BASNet's decoder too).
        "image_shape": (None, None, 3),
    },
    "SegFormerBackbone": {"image_encoder": part("MiTBackbone")},
    "DepthAnythingBackbone": {
        "image_encoder": part("DINOV2Backbone", apply_layernorm=True),
        "reassemble_factors": [2, 1],
        "neck_hidden_dims": [8, 16],
        "fusion_hidden_dim": 16,
        "head_hidden_dim": 8,
        "head_in_index": -1,
        "feature_keys": ["stage1", "stage2"],
    },
    "PARSeqBackbone": {
        "image_encoder": part(
            "ViTBackbone", image_shape=(16, 32, 3), patch_size=(4, 8), use_class_token=False
        ),
        "dropout_rate": 0.0,
        "attention_dropout": 0.0,
    },
    "DFineBackbone": {
        "backbone": part("HGNetV2Backbone", out_features=["stage1", "stage2"]),
        "decoder_in_channels": [16, 16],
        "encoder_hidden_dim": 16,
        "num_denoising": 0,
        "num_labels": 3,
        "learn_initial_query": False,
        "num_queries": 8,
        "anchor_image_size": (32, 32),
        "feat_strides": [4, 8],
        "num_feature_levels": 2,
        "encoder_in_channels": [16, 32],
        "encode_proj_layers": [1],
        "encoder_ffn_dim": 32,
        "num_encoder_layers": 1,
        "hidden_expansion": 0.5,
        "depth_multiplier": 0.5,
        "eval_idx": -1,
        "decoder_attention_heads": 2,
        "decoder_ffn_dim": 32,
        "decoder_n_points": [2, 2],
        "lqe_hidden_dim": 16,
        "num_lqe_layers": 2,
        "out_features": ["stage1", "stage2"],
        "seed": 0,
    },
    "SAMBackbone": {
        "image_encoder": part(
            "ViTDetBackbone", image_shape=(32, 32, 3), patch_size=4, num_output_channels=8
        ),
        "prompt_encoder": part(
            _SAM + "sam_prompt_encoder.SAMPromptEncoder",
            hidden_size=8,
            image_embedding_size=(8, 8),
            input_image_size=(32, 32),
            mask_in_channels=4,
        ),
        "mask_decoder": part(
            _SAM + "sam_mask_decoder.SAMMaskDecoder",
            hidden_size=8,
            num_layers=2,
            intermediate_dim=16,
            num_heads=2,
            embedding_dim=8,
            num_multimask_outputs=3,
            iou_head_depth=2,
            iou_head_hidden_dim=8,
        ),
    },
    "SAM3PromptableConceptBackbone": {
        "vision_encoder": part(
            _SAM3 + "sam3_vision_encoder.SAM3VisionEncoder",
            image_shape=(28, 28, 3),
            patch_size=14,
            fpn_hidden_dim=16,
            fpn_scale_factors=[4.0, 2.0, 1.0, 0.5],
            pretrain_image_shape=(42, 42, 3),
            window_size=2,
            global_attn_indexes=[1],
        ),
        "text_encoder": part(_SAM3 + "sam3_text_encoder.SAM3TextEncoder"),
        "geometry_encoder": part(_SAM3 + "sam3_geometry_encoder.SAM3GeometryEncoder", roi_size=7),
        "detr_encoder": part(_SAM3 + "sam3_detr_encoder.SAM3DetrEncoder"),
        "detr_decoder": part(
            _SAM3 + "sam3_detr_decoder.SAM3DetrDecoder",
            image_shape=(28, 28, 3),
            patch_size=14,
            num_queries=8,
        ),
        "mask_decoder": part(_SAM3 + "sam3_mask_decoder.SAM3MaskDecoder", num_upsampling_stages=3),
    },
    "BLIP2Backbone": {
        "vision_encoder": part(
            "BLIP2VisionEncoder",
            image_size=16,
            use_patch_bias=True,
            use_class_token=True,
            use_mha_bias=True,
            use_mlp_bias=True,
            dropout_rate=0.0,
            layer_norm_epsilon=1e-5,
            initializer_range=0.02,
        ),
        "qformer": part(
            "BLIP2QFormer",
            num_query_tokens=4,
            vision_dim=16,
            cross_attention_frequency=1,
            dropout=0.0,
            layer_norm_epsilon=1e-5,
        ),
        "language_model": part(
            "BLIP2CustomOPT", num_query_tokens=4, qformer_hidden_dim=16, dropout=0.0
        ),
    },
    "StableDiffusion3Backbone": {
        "mmdit_patch_size": 2,
        "mmdit_hidden_dim": 16,
        "mmdit_num_layers": 2,
        "mmdit_num_heads": 2,
        "mmdit_position_size": 8,
        "mmdit_qk_norm": None,
        "mmdit_dual_attention_indices": None,
        "vae": part(
            _SD3_VAE,
            # 32 filters: its GroupNormalization has 32 groups
            encoder_num_filters=[32, 32, 32, 32],
            encoder_num_blocks=[1, 1, 1, 1],
            decoder_num_filters=[32, 32, 32, 32],
            decoder_num_blocks=[1, 1, 1, 1],
            sampler_method="mode",
        ),
        "clip_l": part(
            "CLIPTextEncoder", intermediate_output_index=-2, name="clip_l", **_CLIP_TEXT
        ),
        "clip_g": part(
            "CLIPTextEncoder", intermediate_output_index=-2, name="clip_g", **_CLIP_TEXT
        ),
        "image_shape": (32, 32, 3),
    },
    "FluxBackbone": {
        "input_channels": 16,
        "hidden_size": 32,
        "mlp_ratio": 2.0,
        "num_heads": 2,
        "depth": 1,
        "depth_single_blocks": 1,
        "axes_dim": [4, 6, 6],
        "theta": 10_000,
        "use_bias": True,
        "guidance_embed": True,
        "image_shape": (16, 16),
        "text_shape": (16, 16),
        "image_ids_shape": (16, 3),
        "text_ids_shape": (16, 3),
        "y_shape": (16,),
    },
    # --- tasks: what is not a size
    "BLIP2Seq2SeqLM": {
        "backbone": part(
            "BLIP2Backbone",
            language_model=part(
                "BLIP2FlanT5", num_query_tokens=4, qformer_hidden_dim=16, dropout=0.0
            ),
        ),
    },
    "DepthAnythingDepthEstimator": {"depth_estimation_type": "relative"},
    # Its constructor compiles it, and the loss reads the tokenizer's padding id.
    "PARSeqCausalLM": {
        "preprocessor": part(
            "PARSeqCausalLMPreprocessor", tokenizer=part("PARSeqTokenizer"), image_converter=None
        ),
    },
}

# Classes that cannot be built tiny, and why (never a silent skip).
NOT_BUILT: dict[str, str] = {
    "FeaturePyramidBackbone": (
        "an abstract base: the Backbone that ResNet, MiT, HGNetV2, ... derive "
        "from for their `pyramid_outputs`; its constructor builds no model of its own"
    ),
}


class NotBuilt(Exception):
    """`NOT_BUILT`'s reason: the class has no tiny model here."""


@dataclass(frozen=True)
class VisionModel:
    """One enumerated class: `kind` is `backbone` or the task base it derives from."""

    name: str
    kind: str
    backbone: str  # the backbone class's name (itself, for a backbone)
    text_rule: str  # why the text zoo skips it (its step 1, or step 2)
    cls: type = field(default=None, repr=False, compare=False)


def _keras_hub():
    import keras_hub

    return keras_hub


def _task_base(cls) -> str:
    """The task base `cls` derives from: the nearest of its MRO with no backbone."""
    for base in cls.__mro__[1:]:
        if getattr(base, "backbone_cls", None) is None:
            return base.__name__
    raise AssertionError(f"{cls.__name__} derives from no task base")


def enumerate_vision() -> list[VisionModel]:
    """Every backbone the text zoo skips, then every task on one, by name."""
    models = _keras_hub().models
    backbones = {}
    for entry in zoo_models.enumerate_zoo():
        if entry.kind != "backbone":
            continue
        if entry.skip_reason:
            reason = entry.skip_reason
        elif entry.name in READS_MEDIA:
            reason = "reads non-integer inputs: images, video or audio"
        else:
            continue
        backbones[entry.cls] = VisionModel(entry.name, "backbone", entry.name, reason, entry.cls)
    tasks = []
    for cls in zoo_models._public_classes():
        if not issubclass(cls, models.Task):
            continue
        backbone_cls = getattr(cls, "backbone_cls", None)
        if backbone_cls not in backbones:
            continue
        reason = f"its backbone {backbone_cls.__name__}: {backbones[backbone_cls].text_rule}"
        tasks.append(VisionModel(cls.__name__, _task_base(cls), backbone_cls.__name__, reason, cls))
    ordered = sorted(backbones.values(), key=lambda model: model.name)
    return ordered + sorted(tasks, key=lambda model: model.name)


def by_name(name: str) -> VisionModel:
    for model in enumerate_vision():
        if model.name == name:
            return model
    raise KeyError(f"{name} is not a keras_hub.models class the text zoo skips")


def _class(name: str) -> type:
    if "." not in name:
        return getattr(_keras_hub().models, name)
    module, attribute = name.rsplit(".", 1)
    return getattr(importlib.import_module(module), attribute)


def construct(cls, given: dict | None = None):
    """A tiny `cls`: `given`, then `EXTRA[cls]`, then sizes (`TINY`); each
    `Part` among them built first, the same way."""
    arguments = {**EXTRA.get(cls.__name__, {}), **(given or {})}
    for name, value in arguments.items():
        if isinstance(value, Part):
            arguments[name] = construct(_class(value.cls), value.arguments)
    tiny = zoo_models.tiny_arguments(cls, arguments, tiny=TINY, extra={})
    # What the signature does not name goes to its **kwargs (a layer's `name`,
    # EfficientNet's `width_coefficient`).
    return cls(**{**arguments, **tiny})


def _takes(cls, name: str) -> bool:
    return name in inspect.signature(cls.__init__).parameters


def build(name: str, redrawn: bool = True):
    """The tiny model `name`, weights redrawn (or, not `redrawn`, as Keras
    initialises them: a detector's box deltas then stay small enough to decode).

    Raises:
        NotBuilt: `NOT_BUILT` names why the class has no tiny model.
    """
    import keras

    if name in NOT_BUILT:
        raise NotBuilt(NOT_BUILT[name])
    entry = by_name(name)
    keras.backend.clear_session()  # fresh layer names, whatever ran before
    keras.utils.set_random_seed(SEED)
    if entry.kind == "backbone":
        model = construct(entry.cls)
    else:
        given = {}
        if _takes(entry.cls, "preprocessor") and "preprocessor" not in EXTRA.get(name, {}):
            given["preprocessor"] = None
        backbone = EXTRA.get(name, {}).get("backbone", Part(entry.backbone))
        given["backbone"] = construct(_class(backbone.cls), backbone.arguments)
        model = construct(entry.cls, given)
    return zoo_models.redraw(model, conv_fan_in=name in CONV_FAN_IN) if redrawn else model


# --- what the model reads ------------------------------------------------------

# The modality of each input, from its shape, dtype and name alone (not from
# the export pipeline's own input roles): a float of rank 4 is images, of rank
# 5 with 3 channels video (SAM's rank-5 masks have 1); a float sequence of
# features or samples is audio; token ids are text.
AUDIO_NAMES = ("features", "input_values", "audio")


def _input_specs(model) -> dict:
    inputs = model.input
    if isinstance(inputs, dict):
        return {name: tensor for name, tensor in inputs.items()}
    inputs = inputs if isinstance(inputs, list | tuple) else [inputs]
    return {tensor.name: tensor for tensor in inputs}


def input_kind(name: str, shape: tuple, dtype: str) -> str:
    """What one input holds: `image`, `video`, `audio`, `text`, `mask` or `other`."""
    floating = "float" in dtype
    if floating and len(shape) == 4:
        return "image"
    if floating and len(shape) == 5 and shape[-1] == 3:
        return "video"
    if floating and any(part in name for part in AUDIO_NAMES):
        return "audio"
    if not floating and name.endswith("token_ids"):
        return "text"
    if name.endswith("padding_mask") or name.endswith("response_mask"):
        return "mask"
    return "other"


def modality(model) -> str:
    """The model's modality from its inputs: `image`, `audio + text`,
    `image + text`, `video`, ...; inputs of no known kind are named."""
    kinds = {}
    for name, tensor in _input_specs(model).items():
        kind = input_kind(name, tuple(tensor.shape), str(tensor.dtype))
        kinds.setdefault(kind, []).append(name)
    known = [kind for kind in ("image", "video", "audio", "text") if kind in kinds]
    other = sorted(kinds.get("other", []))
    return " + ".join(known + ([f"other ({', '.join(other)})"] if other else []))


# --- an independent feed -------------------------------------------------------

# Built from each input's shape, dtype and name alone, as `zoo_models.padded_feed`
# is for text: the export's own grid never chose these values or sizes.
BATCH = len(zoo_models.ENCODER_LENGTHS)  # 3 rows, the text rows' padded lengths
# (height, width) where the model takes any: not square, and multiples of 32
# (a feature pyramid adds maps 32 times smaller, upsampled: RetinaNet fails in
# Keras itself at 48 x 64).
FREE_SIDES = (64, 96)
SAMPLES = 1024  # audio samples (Moonshine reads at least 384)
FRAMES = 64  # audio feature frames (Whisper's tiny encoder table)


def _free(shape: tuple, fill: tuple) -> tuple:
    """`shape` with the batch set to BATCH and each other free axis from `fill`."""
    sizes = iter(fill)
    return (BATCH,) + tuple(next(sizes) if dim is None else dim for dim in shape[1:])


# Models whose text takes one length only (SigLIP's text tower adds its whole
# position table): their text is padded to it.
FEED_WIDTH = {"SigLIPBackbone": _CLIP_TEXT["max_sequence_length"]}


def media_feed(model, name: str | None = None, seed: int = 1) -> dict:
    """A batch of `BATCH` rows for every input of `model`: images in [0, 1] at
    the model's own size or `FREE_SIDES`, video frames likewise, audio samples
    in [-1, 1] or feature frames, text right-padded as the text zoo pads it,
    prompts (points, labels, boxes) inside the image; other floats N(0, 1).
    `name` is the zoo's name of the model (its `FEED_WIDTH`)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    specs = _input_specs(model)
    kinds = {name: input_kind(name, tuple(t.shape), str(t.dtype)) for name, t in specs.items()}
    # A speech model's encoder mask is over its samples (Moonshine), a text's over tokens.
    own = ("response_mask", "encoder_padding_mask") if "audio" in kinds.values() else ()
    own = ("response_mask", *own)
    text = {
        name: tensor
        for name, tensor in specs.items()
        if kinds[name] in ("text", "mask") and name not in own
    }
    feeds = {}
    if text:
        holder = type("Inputs", (), {"input": text})
        feeds.update(zoo_models.padded_feed(holder, seed=seed, width=FEED_WIDTH.get(name)))
    if "response_mask" in specs:  # PaliGemma: each row's tokens after its first two answer
        valid = feeds["padding_mask"].astype(bool)
        feeds["response_mask"] = (valid & (np.arange(valid.shape[1]) >= 2)).astype(
            str(specs["response_mask"].dtype)
        )
    for name, tensor in specs.items():
        if name in feeds:
            continue
        shape, dtype = tuple(tensor.shape), str(tensor.dtype)
        kind = input_kind(name, shape, dtype)
        if kind in ("image", "video"):
            value = rng.uniform(0, 1, _free(shape, FREE_SIDES))
        elif kind == "audio":
            length = FRAMES if "features" in name else SAMPLES
            value = rng.uniform(-1, 1, _free(shape, (length, length)))
        elif name == "encoder_padding_mask":  # over the audio samples: every one valid
            value = np.ones(_free(shape, (SAMPLES,)), bool)
        elif name == "boxes" and shape[-1] == 5:  # SAM3: image index, centre, size in [0, 1]
            value = rng.uniform(0.1, 0.4, _free(shape, (2,)))
            value[..., 0] = np.arange(BATCH)[:, None]
            value[..., 1:3] += 0.3
        elif name in ("points", "boxes"):
            value = rng.uniform(0, min(_image_sides(specs)), _free(shape, (2, 2)))
        elif name in ("labels", "box_labels"):
            value = rng.integers(0, 2, _free(shape, (2,)))
        elif name == "masks":  # SAM: no mask prompt
            value = np.zeros(_free(shape, (0, 1, 1)))
        elif "int" in dtype:
            value = rng.integers(1, 3, _free(shape, (2, 2)))
        else:
            value = rng.normal(size=_free(shape, (2, 2, 2)))
        feeds[name] = value.astype(dtype)
    return feeds


def _image_sides(specs: dict) -> tuple:
    for name, tensor in specs.items():
        shape = tuple(tensor.shape)
        if input_kind(name, shape, str(tensor.dtype)) == "image":
            return tuple(side or free for side, free in zip(shape[1:3], FREE_SIDES, strict=True))
    return FREE_SIDES


def _leaves(value, name: str = "") -> dict:
    """Every array of a nested output by the name the file gives it: a dict's
    key, a nested list's position, joined by `_` (D-FINE's tuples)."""
    join = (lambda key: f"{name}_{key}") if name else str
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _leaves(item, join(key)).items()}
    if isinstance(value, list | tuple):
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, join(i)).items()}
    return {name: value}


def parity(model, onnx_path, feeds: dict) -> dict:
    """Max abs difference per ONNX output between ONNX Runtime and
    `model(feeds)`: inputs by name where the file keeps the model's, else in
    the model's order; outputs by name for a dict, else in order. Where the
    model reads text, only the text's valid positions are compared
    (`zoo_models.parity`'s rule). Each difference is divided by the output's
    standard deviation where that is above 1, as the export's own tolerance
    scales with it."""
    import keras
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [entry.name for entry in session.get_inputs()]
    ordered = list(_input_specs(model))
    if len(names) != len(ordered):
        raise ValueError(f"the ONNX file takes {names}, the model {ordered}")
    onnx_feed = {
        name: feeds[name if name in feeds else ordered[index]] for index, name in enumerate(names)
    }
    got = session.run(None, onnx_feed)
    model_inputs = model.input
    if isinstance(model_inputs, dict):
        expected = model(feeds, training=False)
    elif isinstance(model_inputs, list | tuple):
        expected = model([feeds[name] for name in ordered], training=False)
    else:
        expected = model(feeds[ordered[0]], training=False)
    leaves = _leaves(expected)
    if isinstance(expected, dict):
        # An output named as an input is `NAME_output` in the file (SAM's `masks`).
        expected = [
            leaves.get(entry.name, leaves.get(entry.name.removesuffix("_output")))
            for entry in session.get_outputs()
        ]
    else:
        expected = list(leaves.values())
    if len(expected) != len(got):
        raise ValueError(f"{len(expected)} Keras outputs, {len(got)} ONNX outputs")
    reads_text = any(name.endswith("token_ids") for name in feeds)
    differences = {}
    for entry, value, mine in zip(session.get_outputs(), expected, got, strict=True):
        value = keras.ops.convert_to_numpy(value)
        if mine.shape != value.shape:
            raise ValueError(f"output {entry.name}: ONNX shape {mine.shape}, Keras {value.shape}")
        mask = zoo_models._output_mask(value, feeds) if reads_text else None
        difference = np.abs(mine.astype("float64") - value.astype("float64"))
        if mask is not None:
            difference, value = difference[mask], value[mask]
        # Over the output's spread where that is above 1 (a detector's raw
        # boxes and logits reach 1e5 with random weights).
        differences[entry.name] = float(difference.max()) / max(1.0, float(np.std(value)))
    return differences


FEED_ATOL = zoo_models.FEED_ATOL

# Models whose convolution kernels are redrawn at N(0, 1 / fan-in)
# (`zoo_models.redraw`), and why. At N(0, 0.2) a 3x3 kernel over 64
# channels multiplies activations by about 5: through BASNet's 40-odd
# convolutions they reach 2.6e6 (measured on a 96x96 image), its sigmoid
# outputs then turn on float32 rounding (a 4e-6 relative difference moves a
# logit near 0 by 0.29, a probability by 0.07), and DepthAnything's ReLU
# head leaves a map of std 0.005. Either way the model, not the file, is
# ill-conditioned: with kernels at a trained network's scale both export
# with the default flags and tolerances (BASNet's grid within 3e-7).
CONV_FAN_IN = {
    "BASNetBackbone": "40-odd convolutions: activations of 2.6e6 at N(0, 0.2)",
    "BASNetImageSegmenter": "BASNetBackbone's",
    "DepthAnythingDepthEstimator": "its ReLU head's map of std 0.005 at N(0, 0.2)",
}

# Classes that export with one flag, which the default export's error names:
# name -> (the `ExportOptions` fields, why). keras-hub's SAM3 runs in Keras
# itself on one image at a time: its geometry encoder's attention broadcasts
# a (batch, boxes + 1) mask against (batch, heads, boxes + 1, boxes + 1),
# which holds only where the batch is 1 (or, by chance, boxes + 1). The
# default grid's batch 2 fails in Keras, and the error says to give a grid of
# batch 1. (The independent feed's 3 rows of 2 boxes are that chance.)
_ONE_ROW = (
    {"shapes": [(1, 28), (1, 12), "unprompted"]},
    "keras-hub's SAM3 runs in Keras on one image at a time",
)
FLAGS: dict[str, tuple[dict, str]] = {
    "SAM3PromptableConceptBackbone": _ONE_ROW,
    "SAM3PromptableConceptImageSegmenter": _ONE_ROW,
}

# The composites `keras_layers.export.parts` splits (`--parts`): two towers,
# SAM, Stable Diffusion 3 (tests/test_zoo_vision.py checks that these are
# exactly the zoo's classes it finds parts in).
PARTS = (
    "CLIPBackbone",
    "MetaCLIP2Backbone",
    "SAMBackbone",
    "SAMImageSegmenter",
    "SigLIPBackbone",
    "StableDiffusion3Backbone",
    "StableDiffusion3ImageToImage",
    "StableDiffusion3Inpaint",
    "StableDiffusion3TextToImage",
)


def export_parts(model, folder, name: str | None = None) -> dict:
    """Export `model` with `--parts` into `folder`, then check each part's file
    on its own independent feed (`media_feed` as for the zoo's `name`, `parity`).

    Returns:
        `{"report": the export's report, "feed": part name -> the largest
        difference on its feed}`; export errors propagate.
    """
    from keras_layers.export import ExportOptions, export_model
    from keras_layers.export.parts import find_parts

    report = export_model(model, f"{folder}/", ExportOptions(parts=True))
    feed = {}
    for part in find_parts(model):
        path = folder / f"{part.name}.onnx"
        feed[part.name] = max(parity(part.model, path, media_feed(part.model, name)).values())
    return {"report": report, "feed": feed}
