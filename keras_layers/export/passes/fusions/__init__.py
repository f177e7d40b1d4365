"""Graph rewrites that fold tf2onnx's decompositions back into single ops.

tf2onnx lowers Keras' `LayerNormalization` to 12-13 elementwise nodes, every
`Dense` on a 3-D input to TensorFlow's `Tensordot` dance, dot-product
attention to transposes, two matmuls, the mask's selects and a softmax, and
keras-hub's RMS norms and rotary embeddings to 6-9 nodes each. No maintained
library folds these forms: onnxslim has no such pattern, and ONNX Runtime's
transformer fusions match the PyTorch and TF1 decompositions of BERT, not
these (it finds none on the reference encoder). So the rules are ours, one
per module, each written as `pattern.Rule` says (the op a match starts from,
the form, a check that gives a reason, a rewrite), each matched strictly:
every intermediate tensor must have exactly the consumers the form expects
and every constant the expected value, or the subgraph is left alone and the
report's `graph.declined` says why. The pipeline's validation then checks the
rewritten graph like any other.

Each rule's module is a pass (`run(proto, context) -> PassResult`, listed in
`slimming.PASSES`) and names the ops it makes (`MAKES`, the report's keys):

- `layer_norm`: `LayerNormalization` (opset 17);
- `matmul`: the `Tensordot` detour of a 3-D `Dense` as one `MatMul`;
- `multi_head_attention`: `MultiHeadAttention` (com.microsoft), matched
  with the pieces of `attention` and `grouped_attention`;
- `group_query_attention`: a cached decoder's attention, with its past and
  present, as `GroupQueryAttention` (com.microsoft);
- `rms_norm`: `SimplifiedLayerNormalization`;
- `rotary`: `RotaryEmbedding` (com.microsoft);
- `gelu`: TensorFlow's exact GELU as `Gelu` by a rule of ours, then ONNX
  Runtime's own GELU (and skip-LayerNorm) fusions, inside our checks.
"""
