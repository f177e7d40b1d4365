"""Einsums as the trace writes them for ONNX: one broadcasting `matmul`, no ellipsis.

The trace (`tracing._einsums_for_onnx`) writes grouped-query
attention's einsums as `einsum_layout` says, and the fusion that matches
them (`fusions.grouped_attention`) reads its transposes from the same
function applied to the same equations: one source, no constants copied.
"""

import string

# keras-hub's grouped-query attention (Gemma, Gemma 3/4, T5Gemma): the logits
# from q (B, T, K, G, H) and k (B, S, K, H), the output from the
# probabilities (B, K, G, T, S) and v (B, S, K, H).
GROUPED_LOGITS = "btkgh,bskh->bkgts"
GROUPED_OUTPUT = "bkgts,bskh->btkgh"


def einsum_layout(subscripts: str):
    """How to compute a two-operand einsum as one broadcasting `matmul`, or None.

    For an einsum with one contracted letter, at least one batch letter (in
    both operands and the output) and more than one free letter on a side,
    such as grouped-query attention's `einsum("btkgh,bskh->bkgts", q, k)` and
    `einsum("bkgts,bskh->btkgh", probs, v)` in keras-hub's Gemma: each operand
    is transposed to (batch, its extra free letters, matrix), with size-1 axes
    where the other operand's extra free letters go, so that `matmul`
    broadcasts over them. The free letters keep the output's order when the
    output starts with the batch letters (no transpose after the product),
    else each operand's own order (no transpose of the operand).

    Returns (perm of a, axes to insert in a, perm of b, axes to insert in b,
    perm of the product or None), or None for any other einsum.
    """
    inputs, _, output = subscripts.replace(" ", "").partition("->")
    parts = inputs.split(",")
    if not output or len(parts) != 2 or "." in subscripts:
        return None
    a, b = parts
    letters = a + b + output
    if any(len(set(x)) != len(x) for x in (a, b, output)) or set(output) - set(a + b):
        return None
    batch = [x for x in output if x in a and x in b]
    contracted = [x for x in a if x in b and x not in output]
    free_a = [x for x in a if x not in b]
    free_b = [x for x in b if x not in a]
    if (
        len(contracted) != 1
        or not batch
        or not free_a
        or not free_b
        or len(free_a) + len(free_b) < 3
        or set(letters) != set(batch + contracted + free_a + free_b)
        or set(free_a + free_b) - set(output)
    ):
        return None
    if output[: len(batch)] == "".join(batch):
        free_a = [x for x in output if x in free_a]
        free_b = [x for x in output if x in free_b]
    else:
        batch = [x for x in a if x in batch]
    (c,) = contracted
    *extra_a, m = free_a
    *extra_b, n = free_b
    layout_a = [*batch, *extra_a, m, c]
    layout_b = [*batch, *extra_b, c, n]
    product = [*batch, *extra_a, *extra_b, m, n]
    # Size-1 axes: in a where b's extra letters go, in b where a's go.
    insert_a = list(range(len(batch) + len(extra_a), len(batch) + len(extra_a) + len(extra_b)))
    insert_b = list(range(len(batch), len(batch) + len(extra_a)))
    after = [product.index(x) for x in output]
    return (
        [a.index(x) for x in layout_a],
        insert_a,
        [b.index(x) for x in layout_b],
        insert_b,
        None if after == sorted(after) else after,
    )


def explicit_ellipsis(subscripts: str, ranks: list) -> str | None:
    """`subscripts` with its "..." written out as letters, given the operands'
    ranks; None when it has no ellipsis or cannot be written out exactly.

    tf2onnx's einsum optimizer, which the convert stage runs, rejects an
    equation with an ellipsis (RoFormerV2's rotary angles,
    `einsum("...,d->...d", positions, frequencies)`), though ONNX's Einsum
    takes one. Letters that the equation does not use stand for the ellipsis
    axes. Only one operand may have ellipsis axes: between two, an ellipsis
    broadcasts size 1 against any size, which the same letter does not.

    Args:
        subscripts: the einsum equation, with "->".
        ranks: each operand's rank (None where unknown: nothing is written out).

    Returns:
        The equation with letters for the ellipsis, or None.
    """
    inputs, arrow, output = subscripts.replace(" ", "").partition("->")
    parts = inputs.split(",")
    if "..." not in subscripts or not arrow or len(parts) != len(ranks) or None in ranks:
        return None
    widths = []
    for part, rank in zip(parts, ranks, strict=True):
        if part.count("...") > 1 or "." in part.replace("...", ""):
            return None
        widths.append(rank - len(part.replace("...", "")) if "..." in part else 0)
    if min(widths) < 0 or sum(width > 0 for width in widths) > 1 or output.count("...") > 1:
        return None
    unused = [c for c in string.ascii_letters if c not in subscripts]
    letters = "".join(unused[: max(widths)])
    # An operand whose "..." covers no axis gets no letter.
    written = [
        part.replace("...", letters[len(letters) - width :] if width else "")
        for part, width in zip(parts, widths, strict=True)
    ]
    return ",".join(written) + "->" + output.replace("...", letters)
