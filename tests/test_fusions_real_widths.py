"""Every fusion at the widths real models have (256 to 1,024), not only at tiny ones.

The zoo and the other fusion tests build models 16 to 64 wide. A vector of 256
float32 values is 1 KiB (`graph.weights.EXTERNAL_MIN_BYTES`), big enough for
the data file the weights are staged in, and no pass reads that file: at 256
and up every LayerNorm of BERT stayed decomposed, the bias before each GELU
stayed out of it and the scale of each RMS norm out of it, while every tiny
test passed. So each architecture below is exported at a tiny width and at
real ones (256 in the default suite, 768 and 1,024 under -m slow), its weights
redrawn as a trained model has them (no zero bias or unit gain for onnxslim
to fold away at one width and not at another): every fusion must fire as
often at each width, and the graph be the tiny one's op for op.
"""

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import onnx
import pytest
from onnx import TensorProto

from keras_layers.export import ExportOptions, export_model
from keras_layers.export.graph import weights
from tests import zoo_models

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.xdist_group("fusions_real_widths"),  # the module's exports: one worker
]

TINY = 32
REAL = 256
SLOW = (768, 1024)
LAYERS = 2
HEADS = 4

# The fused ops of each model (2 layers): a norm before each of the two blocks
# of a layer and one more (the embeddings' in BERT and RoBERTa, the final one
# in the decoders), a rotary embedding for each layer's queries and keys.
FUSED = {
    "bert": {"LayerNormalization": 5, "MultiHeadAttention": 2, "MatMul": 4, "FastGelu": 2},
    "roberta": {"LayerNormalization": 5, "MultiHeadAttention": 2, "MatMul": 4, "BiasGelu": 2},
    # Every axis of its hidden states but the batch is static (the patches and
    # the class token), so TensorFlow writes each Dense's way back as a constant.
    "vit": {"LayerNormalization": 5, "MultiHeadAttention": 2, "MatMul": 4, "BiasGelu": 2},
    "gpt2": {"LayerNormalization": 5, "MultiHeadAttention": 2, "MatMul": 4, "FastGelu": 2},
    "llama": {
        "SimplifiedLayerNormalization": 5,
        "MultiHeadAttention": 2,
        "MatMul": 6,
        "RotaryEmbedding": 4,
    },
    "gemma": {
        "SimplifiedLayerNormalization": 5,
        "MultiHeadAttention": 2,
        "RotaryEmbedding": 4,
        "FastGelu": 2,
    },
    "llama with cache": {
        "SimplifiedLayerNormalization": 5,
        "GroupQueryAttention": 2,
        "MatMul": 7,
        "RotaryEmbedding": 4,
    },
}
# Models whose feed-forward Dense has a bias, which the GELU after it takes in,
# and whose attention projects q, k and v with a bias, which the attention takes in.
BIASED = ("bert", "roberta", "gpt2", "vit")
# What may stand between a projection's product and the attention reading it.
LAYOUT = ("Reshape", "Squeeze", "Unsqueeze", "Transpose")
# What a decomposition that no rule fused leaves behind (BERT's pooler keeps its Tanh).
DECOMPOSED = ("ReduceMean", "Sqrt", "Reciprocal", "Softmax", "Erf", "Pow")
# A cached decoder's export checks generation too, 10-17 s at each width: under
# -m slow (test_causal_lm's GPT-2 runs the rule in the default suite).
CACHED = "llama with cache"


def build(kind: str, width: int):
    """A 2-layer keras-hub model of `kind`, `width` wide, every float weight redrawn."""
    import keras_hub

    models = keras_hub.models
    keras.utils.set_random_seed(0)
    if kind == "vit":  # 32 x 32 images in patches of 8: 16 patches and the class token
        backbone = models.ViTBackbone(
            image_shape=(32, 32, 3),
            patch_size=8,
            num_layers=LAYERS,
            num_heads=HEADS,
            hidden_dim=width,
            mlp_dim=2 * width,
        )
        return zoo_models.redraw(models.ViTImageClassifier(backbone, num_classes=5))
    sizes = {"vocabulary_size": 100, "num_layers": LAYERS, "hidden_dim": width}
    sizes["intermediate_dim"] = 2 * width
    if kind in ("bert", "roberta", "gpt2"):
        backbone = {"bert": models.BertBackbone, "roberta": models.RobertaBackbone}.get(
            kind, models.GPT2Backbone
        )
        return zoo_models.redraw(backbone(num_heads=HEADS, max_sequence_length=64, **sizes))
    if kind == "gemma":  # one key/value head, its head size given
        backbone = models.GemmaBackbone(
            num_query_heads=HEADS, num_key_value_heads=1, head_dim=width // HEADS, **sizes
        )
        return zoo_models.redraw(backbone)
    backbone = models.LlamaBackbone(num_query_heads=HEADS, num_key_value_heads=2, **sizes)
    if kind == CACHED:
        backbone = models.LlamaCausalLM(backbone, preprocessor=None)
    return zoo_models.redraw(backbone)


def projection_biases(model) -> list:
    """Each layer's query, key and value biases, each flattened, concatenated:
    the `bias` input of its fused attention."""
    found = []
    for layer in range(LAYERS):
        by_side = {}
        for weight in model.weights:
            # keras-hub's text models count their layers from 0, its ViT from 1.
            side = re.fullmatch(
                rf"(?:transformer_layer_{layer}|vit_encoder/transformer_block_{layer + 1})"
                r"/[^/]+/(query|key|value)/bias",
                weight.path,
            )
            if side:
                by_side[side.group(1)] = keras.ops.convert_to_numpy(weight).reshape(-1)
        found.append(np.concatenate([by_side[side] for side in ("query", "key", "value")]))
    return found


@dataclass
class Export:
    """One model's export: its report, the graph (less its data file), the
    file, and `projection_biases` of the model where it has them."""

    report: dict
    graph: onnx.GraphProto
    path: Path
    biases: list | None

    @property
    def nodes(self) -> list:
        return list(self.graph.node)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`export(kind, width)`: the model's `Export`, made once."""
    made = {}

    def export(kind: str, width: int) -> Export:
        if (kind, width) not in made:
            path = tmp_path_factory.mktemp("widths") / f"{kind.replace(' ', '_')}_{width}.onnx"
            model = build(kind, width)
            if kind == CACHED:
                report = export_model(model, path, task="causal-lm")
            elif kind == "vit":
                report = export_model(model, path)
            else:
                report = export_model(model, path, ExportOptions(shapes=[(2, 16)]))
            graph = onnx.load(str(path), load_external_data=False).graph
            biases = projection_biases(model) if kind in BIASED else None
            made[kind, width] = Export(report, graph, path, biases)
        return made[kind, width]

    return export


def cases(widths) -> list:
    """(kind, width) for every model; 768, 1,024 and the cached decoder under -m slow."""
    found = []
    for kind in FUSED:
        for width in widths:
            slow = width in SLOW or kind == CACHED
            marks = [pytest.mark.slow] if slow else []
            found.append(pytest.param(kind, width, marks=marks, id=f"{kind}-{width}"))
    return found


@pytest.mark.parametrize("kind, width", cases((TINY, REAL, *SLOW)))
def test_every_fusion_fires_at_every_width(exported, kind, width):
    made = exported(kind, width)
    report, nodes = made.report, made.nodes
    assert report["passed"], report["worst"]
    fused = {op: count for op, count in report["graph"]["fused"].items() if count}
    assert fused == FUSED[kind], report["graph"]["declined"]
    ops = Counter(node.op_type for node in nodes)
    assert not {op: ops[op] for op in DECOMPOSED if ops[op]}
    if kind in BIASED:
        gelus = [node for node in nodes if node.op_type.endswith("Gelu")]
        assert [len(node.input) for node in gelus] == [2] * LAYERS, "a bias left out of a GELU"


@pytest.mark.parametrize(
    "kind, width", [case for case in cases((TINY, REAL)) if case.values[0] in BIASED]
)
def test_the_query_key_and_value_biases_are_the_attentions_bias_input(exported, kind, width):
    """Keras' `EinsumDense` adds each projection's (heads, head size) bias in
    an `Add` of its own; the fused op takes the three as its `bias` input (q's,
    k's, then v's: 3 x width values) and adds them as it lays q, k and v out
    by heads. No `Add` is left between a projection's product and the
    attention, and the input holds the model's own biases, at 256 too, where
    each (4, 64) bias is a matrix of 1 KiB in the staged data file."""
    made = exported(kind, width)
    report, nodes = made.report, made.nodes
    assert report["passed"], report["worst"]
    producer = {output: node for node in nodes for output in node.output}
    stored = {tensor.name: tensor for tensor in made.graph.initializer}
    attentions = [node for node in nodes if node.op_type == "MultiHeadAttention"]
    assert len(attentions) == LAYERS
    for node, biases in zip(attentions, made.biases, strict=True):
        for name in node.input[:3]:
            before = producer[name]
            while before.op_type in LAYOUT:
                before = producer[before.input[0]]
            assert before.op_type in ("Gemm", "MatMul"), f"a {before.op_type} before the attention"
        assert len(node.input) > 3 and node.input[3] in stored, "no bias input"
        bias = weights.values(stored[node.input[3]], made.path.parent)
        np.testing.assert_array_equal(bias, biases)


@pytest.mark.parametrize("kind, width", cases((REAL, *SLOW)))
def test_a_real_width_gives_the_tiny_widths_graph(exported, kind, width):
    """Op for op: a scale or a bias left beside the op it belongs in (an RMS
    norm's scale `Mul`, Gemma's `1 + scale`) adds nodes and fuses nothing less."""
    tiny, real = exported(kind, TINY).nodes, exported(kind, width).nodes
    assert Counter(node.op_type for node in real) == Counter(node.op_type for node in tiny)


def test_a_converted_vector_stays_in_the_graph_and_a_matrix_goes_to_the_data_file(tmp_path):
    """However wide the vector: a gamma or a bias of 4,096 floats (16 KiB) is
    a constant to the passes, which read no data file."""
    staged = {}
    with open(tmp_path / "staged.data", "wb") as data:
        for name, shape in {"gamma": (4096,), "bias": (1, 1, 4096), "kernel": (2, 4096)}.items():
            tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
            weights.stage(tensor, np.ones(shape, np.float32), data)
            staged[name] = weights.is_external(tensor)
    assert staged == {"gamma": False, "bias": False, "kernel": True}
