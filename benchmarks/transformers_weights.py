"""A keras-hub BART's or T5's weights in transformers' own model.

The peer of the seq2seq benchmark and of the optimum test runs the same
weights through PyTorch and optimum's exporter. keras-hub reads transformers'
BART checkpoints with its own converter (`keras_hub.src.utils.transformers.
convert_bart.convert_weights`), a list of `port_weight(keras variable,
transformers key, hook)` calls whose hooks transpose, reshape or slice. This
runs that list backwards instead of writing a second mapping by hand: each
hook is applied to the indices of the transformers tensor, which says where
each Keras value came from, and the Keras values are written there. keras-hub
has no transformers converter for T5, so its mapping is written out
(`_t5_ports`).
"""

import numpy as np

# The keys of transformers' BART that share `model.shared.weight`.
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


class _Recorder:
    """Stands in for keras-hub's safetensors loader: records each port."""

    def __init__(self):
        self.ports = []

    def port_weight(self, keras_variable, hf_weight_key, hook_fn=None):
        self.ports.append((keras_variable, hf_weight_key, hook_fn))


def bart_model(model, config: dict):
    """`BartForConditionalGeneration` of `config` (the folder's `config.json`)
    holding `model`'s weights.

    Args:
        model: a keras-hub `BartSeq2SeqLM`.
        config: transformers' config of it (`transformers_config.configs`).

    Returns:
        The PyTorch model, in eval mode.
    """
    import torch
    from keras_hub.src.utils.transformers import convert_bart
    from transformers import BartConfig, BartForConditionalGeneration

    hf = BartForConditionalGeneration(BartConfig(**config)).eval()
    recorder = _Recorder()
    convert_bart.convert_weights(model.backbone, recorder, None)
    state = {key: value.detach().numpy().copy() for key, value in hf.state_dict().items()}
    for variable, key, hook in recorder.ports:
        key = key if key in state else f"model.{key}"  # the loader's prefix
        target = state[key]
        where = np.arange(target.size).reshape(target.shape)
        keras_shape = list(variable.shape)
        where = np.reshape(hook(where, keras_shape) if hook else where, keras_shape)
        flat = target.reshape(-1)
        flat[where.reshape(-1)] = np.asarray(variable.numpy(), target.dtype).reshape(-1)
    for tied in TIED:  # one matrix: loading the others' random copies would undo it
        state[tied] = state["model.shared.weight"]
    tensors = {key: torch.from_numpy(value) for key, value in state.items()}
    missing = hf.load_state_dict(tensors, strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    hf.tie_weights()
    return hf


def _t5_ports(backbone) -> list:
    """`(keras variable, transformers key, transpose)` of a keras-hub T5.

    keras-hub converts no transformers T5 checkpoint, so this mapping is
    written here, from both sides' layers: a Dense kernel is (in, out), a
    transformers Linear weight (out, in); keras-hub's `input_projector`
    carries the activation (`wi_0` of a gated feed-forward, `wi` otherwise)
    and `gate_projector` the linear half (`wi_1`).
    """
    ports = [(backbone.token_embedding.embeddings, "shared.weight", False)]
    if not backbone.tie_embedding_weights:
        ports.append((backbone.token_embedding.reverse_embeddings, "lm_head.weight", True))
    gated = backbone.use_gated_activation

    def attention(layer, prefix):
        found = [
            (getattr(layer, f"{name}_projector").kernel, f"{prefix}.{short}.weight", True)
            for name, short in (("query", "q"), ("key", "k"), ("value", "v"), ("output", "o"))
        ]
        if layer.use_relative_attention_bias:
            key = f"{prefix}.relative_attention_bias.weight"
            found.append((layer.relative_attention_bias, key, False))
        return found

    def feed_forward(layer, prefix):
        names = [("input", "wi_0" if gated else "wi"), ("output", "wo")]
        if gated:
            names.append(("gate", "wi_1"))
        return [
            (
                getattr(layer, f"{name}_projector").kernel,
                f"{prefix}.DenseReluDense.{short}.weight",
                True,
            )  # fmt: skip
            for name, short in names
        ]

    for side, layers in (("encoder", backbone.encoder_transformer_layers),
                         ("decoder", backbone.decoder_transformer_layers)):  # fmt: skip
        for index, layer in enumerate(layers):
            block = f"{side}.block.{index}.layer"
            ports += attention(layer.self_attention, f"{block}.0.SelfAttention")
            norm = layer.self_attention_layer_norm.weight
            ports.append((norm, f"{block}.0.layer_norm.weight", False))
            last = 1
            if side == "decoder":
                ports += attention(layer.cross_attention, f"{block}.1.EncDecAttention")
                norm = layer.cross_attention_layer_norm.weight
                ports.append((norm, f"{block}.1.layer_norm.weight", False))
                last = 2
            ports += feed_forward(layer, f"{block}.{last}")
            ports.append((layer.layer_norm.weight, f"{block}.{last}.layer_norm.weight", False))
        norm = getattr(backbone, f"{side}_layer_norm")
        ports.append((norm.weight, f"{side}.final_layer_norm.weight", False))
    return ports


def t5_model(model, config: dict):
    """`T5ForConditionalGeneration` of `config` holding a keras-hub
    `T5Seq2SeqLM`'s weights (`_t5_ports`).

    Args:
        model: a keras-hub `T5Seq2SeqLM`.
        config: transformers' config of it (`transformers_config.configs`).

    Returns:
        The PyTorch model, in eval mode.
    """
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    hf = T5ForConditionalGeneration(T5Config(**config)).eval()
    state = {key: value.detach().numpy().copy() for key, value in hf.state_dict().items()}
    written = set()
    for variable, key, transpose in _t5_ports(model.backbone):
        value = np.asarray(variable.numpy(), np.float32)
        value = value.T if transpose else value
        assert value.shape == state[key].shape, (key, value.shape, state[key].shape)
        state[key] = value
        written.add(key)
    tied = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
    tied += ("lm_head.weight",) if model.backbone.tie_embedding_weights else ()
    for key in tied:
        state[key] = state["shared.weight"]
        written.add(key)
    assert written == set(state), sorted(set(state) - written)
    hf.load_state_dict({key: torch.from_numpy(value) for key, value in state.items()})
    return hf


def transformers_model(model, config: dict):
    """transformers' model of a keras-hub BART or T5 with its weights
    (`bart_model`, `t5_model`), by `config["model_type"]`."""
    return {"bart": bart_model, "t5": t5_model}[config["model_type"]](model, config)
