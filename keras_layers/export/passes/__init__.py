"""The slim stage's passes, each a module with one `run(proto, context) -> PassResult`.

Every pass reads the ModelProto and a `Context` (a frozen dataclass: the
opset, the shapes once inferred, the input axes that are at least 1 and
their names, whether the model is a decoder with a cache, ...) and returns a
`PassResult`: the proto, how many nodes of each op it fused, what it declined
and why, what it changed, and what the passes after it may know. They import
`keras_layers.export.graph` and each other, nothing above them;
`slimming.PASSES` lists them in order, with the condition each runs under.

- `stacks`: picks of stacked tensors folded (a decoder's caches);
- `onnxslim_pass`: onnxslim's constant folding and dead-node removal;
- `shape_inference`: ONNX shape inference, once, for the fusions;
- `weight_views`: reshapes of a weight folded into it, where onnxslim does
  not run;
- `fusions`: one rule per fused op (`fusions.pattern`);
- `dead_nodes`: what no output reads dropped;
- `axis_names`: the graph's dynamic axes named after the model's;
- `conv_layout`: a convolutional model's Transposes moved to its edges
  (tf2onnx's TransposeOptimizer) and its BatchNorms folded into its Convs;
- `share_shapes`: one `Shape` for tensors proven to share their dims;
- `common_subexpressions`: nodes computing what an earlier one computes merged;
- `initializers`: repeated and transposed weights stored once;
- `canonical`: the same model gives the same bytes on every run.

Adding a pass: a module here (or a rule in `fusions`) with `run`, its test,
and its place in `slimming.PASSES`.
"""

from keras_layers.export.passes.context import Context, PassResult, Step, run_passes

__all__ = ["Context", "PassResult", "Step", "run_passes"]
