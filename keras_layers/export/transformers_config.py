"""`config.json` and `generation_config.json` for a seq2seq folder of a BART or T5.

With these beside `encoder_model.onnx` and `decoder_model_merged.onnx`
(`merged_decoder`), optimum's `ORTModelForSeq2SeqLM.from_pretrained(FOLDER)`
loads the folder and generates with transformers' own loop (and
transformers.js reads the same layout). The config is the transformers
architecture of the keras-hub backbone, field by field from its
`get_config()`; the generation config holds the decoder's start, as keras-hub
starts it: BART's `</s> <s>` is transformers' `decoder_start_token_id` then
`forced_bos_token_id`.

Only BART and T5 have a transformers architecture written here; for other
models, and for a T5 whose activation transformers cannot name, `configs`
returns the reason instead, which the report keeps.
"""

from dataclasses import dataclass

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"


@dataclass(frozen=True)
class Written:
    """The two configs, or why there are none."""

    config: dict | None
    generation: dict | None
    why_not: str = ""


def _bart(config: dict) -> dict:
    return {
        "model_type": "bart",
        "architectures": ["BartForConditionalGeneration"],
        "vocab_size": config["vocabulary_size"],
        "d_model": config["hidden_dim"],
        "encoder_layers": config["num_layers"],
        "decoder_layers": config["num_layers"],
        "encoder_attention_heads": config["num_heads"],
        "decoder_attention_heads": config["num_heads"],
        "encoder_ffn_dim": config["intermediate_dim"],
        "decoder_ffn_dim": config["intermediate_dim"],
        "max_position_embeddings": config["max_sequence_length"],
        "activation_function": "gelu",  # keras.activations.gelu: exact, not tanh
        "scale_embedding": False,
        "tie_word_embeddings": True,
    }


def _t5(config: dict) -> dict | str:
    activation = config["activation"]
    if isinstance(activation, dict):  # a serialized Keras function
        activation = activation.get("config", activation.get("class_name"))
    activation = str(activation).rsplit(".", 1)[-1]
    gated = config["use_gated_activation"]
    if activation not in ("relu", "gelu") or (gated and activation == "gelu"):
        # transformers' "gated-gelu" is gelu's tanh approximation, Keras' gelu is exact
        return f"transformers' T5 has no {'gated ' if gated else ''}{activation} feed-forward"
    heads = config["num_heads"]
    return {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "vocab_size": config["vocabulary_size"],
        "d_model": config["hidden_dim"],
        "d_kv": config["key_value_dim"] or config["hidden_dim"] // heads,
        "d_ff": config["intermediate_dim"],
        "num_layers": config["num_layers"],
        "num_decoder_layers": config["num_layers"],
        "num_heads": heads,
        "relative_attention_num_buckets": 32,  # keras-hub's T5MultiHeadAttention's
        "relative_attention_max_distance": 128,
        "feed_forward_proj": ("gated-" if gated else "") + activation,
        "layer_norm_epsilon": config["layer_norm_epsilon"],
        "tie_word_embeddings": config["tie_embedding_weights"],
    }


ARCHITECTURES = {"BartBackbone": _bart, "T5Backbone": _t5}


def configs(model, start, end, pad) -> Written:
    """The transformers configs of an encoder-decoder, or why there are none.

    Args:
        model: the encoder-decoder (a keras-hub `Seq2SeqLM`).
        start: the decoder's start tokens (`seq2seq_folder.Special`), or None.
        end: the end id, or None.
        pad: the pad id.

    Returns:
        `Written`: `config.json`'s and `generation_config.json`'s contents.

    Example:

    >>> import keras_hub
    >>> backbone = keras_hub.models.BartBackbone(vocabulary_size=40, num_layers=1,
    ...     num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> model = keras_hub.models.BartSeq2SeqLM(backbone, preprocessor=None)
    >>> written = configs(model, (2, 0), 2, 1)
    >>> written.config["model_type"], written.generation["forced_bos_token_id"]
    ('bart', 0)
    """
    backbone = getattr(model, "backbone", None)
    write = ARCHITECTURES.get(type(backbone).__name__)
    if write is None:
        return Written(None, None, "transformers' architecture is written for BART and T5 only")
    if not start or len(start) > 2:
        return Written(
            None,
            None,
            "transformers starts the decoder with one token (and one forced after it); "
            f"this model's start is {list(start or [])}",
        )
    config = write(backbone.get_config())
    if isinstance(config, str):
        return Written(None, None, config)
    special = {
        "decoder_start_token_id": start[0],
        "forced_bos_token_id": start[1] if len(start) == 2 else None,
        "bos_token_id": start[1] if len(start) == 2 else None,
        "eos_token_id": end,
        "pad_token_id": pad,
        "forced_eos_token_id": None,  # BART's default forces an end at max_length
    }
    config.update(special, is_encoder_decoder=True, use_cache=True)
    generation = {key: value for key, value in special.items() if value is not None}
    return Written(config, {**generation, "forced_eos_token_id": None})
