"""The one helper every fusion rule shares: a rule's parts, and running it.

A rule is written as four parts, each read on its own:

- `anchor`: the op type of the node a match starts from (a `Softmax` for
  attention, the final `Add` of a LayerNorm);
- `form`: the subgraph it matches, in the notation the docs use;
- `match(graph, anchor node)`: walks the form from the anchor through
  `graph.Graph`'s lookups and checks every fact the fused op assumes
  (consumers, constants, shapes, element types). It returns what the rewrite
  needs, a reason (a string) when a check fails, or None when the node is no
  candidate at all;
- `rewrite(edit, match)`: says, through `graph.Edit`, which nodes replace which.

`apply` runs a rule over a graph: every reason goes to the caller's
`declined` list as (anchor output, reason), the report's `graph.declined`;
`run_rule` does it for a pass and returns its `PassResult`. No rewrite
changes the graph while matching goes on: `Edit` records the changes and
makes them in one pass at the end, so every match sees the graph tf2onnx
wrote.

Why this helper rather than onnxscript's rewriter (which also has patterns,
checks with reasons and replacements): docs/export.md, "How a fusion is
written", measured by benchmarks/rule_engines.py.
"""

from collections.abc import Callable
from dataclasses import dataclass

from keras_layers.export.graph import (
    Edit,
    Graph,
    attribute,
    opset,
    perm,
    sort_topologically,
    static_value,
    use_contrib_domain,
)
from keras_layers.export.passes.context import PassResult

__all__ = [
    "Edit",
    "Graph",
    "Rule",
    "apply",
    "attribute",
    "last_axis_reduce",
    "opset",
    "perm",
    "run_rule",
    "sort_topologically",
    "static_value",
    "use_contrib_domain",
]


@dataclass(frozen=True)
class Rule:
    """One fusion: where a match starts, the form it takes, its check and its rewrite."""

    makes: str  # the op type the rewrite makes, the report's key
    anchor: str
    form: str
    match: Callable
    rewrite: Callable
    reason_prefix: str = ""  # put before each reason in `declined`


def apply(rule: Rule, proto, declined: list | None = None, shapes=None, dims=None) -> int:
    """Match `rule` at every node of its anchor type and rewrite each match.

    Args:
        rule: the rule.
        proto: the ModelProto, rewritten in place.
        declined: when given, gets (anchor's output, reason) for each
            candidate whose check failed.
        shapes: `graph.tensor_shapes` of the graph, for the `Graph` the
            match reads.
        dims: `graph.symbolic_dims` of the graph, where the match reads them.

    Returns:
        How many matches were rewritten.
    """
    g = Graph(proto.graph, shapes, dims)
    edit = Edit(proto)
    for node in [n for n in proto.graph.node if n.op_type == rule.anchor]:
        found = rule.match(g, node)
        if isinstance(found, str):
            if declined is not None:
                declined.append((node.output[0], rule.reason_prefix + found))
        elif found is not None:
            rule.rewrite(edit, found)
            edit.count += 1
    edit.commit()
    return edit.count


def run_rule(rule: Rule, proto, shapes=None, dims=None) -> PassResult:
    """`apply` as a pass: the rule's count under `rule.makes`, and its reasons.

    Args:
        rule: the rule.
        proto: the ModelProto, rewritten in place.
        shapes: as for `apply`.
        dims: as for `apply`.

    Returns:
        The pass's result.
    """
    declined = []
    count = apply(rule, proto, declined, shapes, dims)
    return PassResult(proto, {rule.makes: count}, tuple(declined), count)


def last_axis_reduce(g, node, rank):
    """Whether a ReduceMean node averages over the last axis only, keeping dims.

    Args:
        g: the `Graph` (for constant axes).
        node: the ReduceMean.
        rank: its input's rank.

    Returns:
        True or False.
    """
    if attribute(node, "keepdims", 1) != 1:
        return False
    axes = attribute(node, "axes", None)
    if axes is None and len(node.input) > 1:
        value = g.const(node.input[1])
        axes = None if value is None else value.reshape(-1).tolist()
    return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)
