"""The graph toolkit every pass is written with: ONNX protos in, nothing else of ours.

This package imports NumPy, onnx and the standard library only (a test checks
it), so every module above it may import it and it imports none of them.

- `walk`: subgraphs (Loop, Scan and If bodies) and the outer values they
  read, renames, dead-node removal, topological order, node accessors;
- `shapes`: ONNX shape inference's shapes and element types;
- `dims`: symbolic dims (`Dim`: an integer times a product of axis names);
- `evaluation` and `ops`: the one static evaluation of a graph, dims and
  values, op by op from a table (`symbolic_dims`, `static_value`);
- `view`: the lookups a rewrite reads (`Graph`) and the changes it records
  (`Edit`);
- `weights`: a weight's values wherever they are (the proto or a data
  file), and the file the user gets written from both.
"""

from keras_layers.export.graph.dims import ONE, Dim, broadcast
from keras_layers.export.graph.evaluation import Evaluation, static_value, symbolic_dims
from keras_layers.export.graph.shapes import tensor_ranks, tensor_shapes
from keras_layers.export.graph.view import Edit, Graph
from keras_layers.export.graph.walk import (
    attribute,
    body_reads,
    free_names,
    labelled_subgraphs,
    node_reads,
    opset,
    perm,
    remove_dead_nodes,
    rename_reads,
    sort_topologically,
    subgraphs,
    topological_order,
    use_contrib_domain,
)

__all__ = [
    "ONE",
    "Dim",
    "Edit",
    "Evaluation",
    "Graph",
    "attribute",
    "body_reads",
    "broadcast",
    "free_names",
    "labelled_subgraphs",
    "node_reads",
    "opset",
    "perm",
    "remove_dead_nodes",
    "rename_reads",
    "sort_topologically",
    "static_value",
    "subgraphs",
    "symbolic_dims",
    "tensor_ranks",
    "tensor_shapes",
    "topological_order",
    "use_contrib_domain",
]
