"""Recurrences that keras-hub runs as Python loops, traced as graph loops.

Two keras-hub layers walk the sequence in Python: Qwen3.5's gated delta net
(`_chunk_gated_delta_rule`: `if pad_size > 0`, then `for ci in
range(num_chunks)` over 64-token chunks) and RWKV-7's time mixing
(`rnn_generalized_delta_rule`: `for t in range(T)`). Eagerly the length is a
number; in a trace with a free sequence axis it is a tensor, and Python cannot
branch or loop on it. For one trace, each is swapped for the same arithmetic
with the loop as a `tf.while_loop` (an ONNX `Loop` once converted): the same
operations on the same values, step by step, so the file computes what the
eager layer computes at every length. The validation proves it against Keras
like any other file, at several lengths and on padded rows.

The chunk's 63-step triangular solve keeps its Python loop: its length is the
chunk size, a constant, and unrolled it stays the same products in the same
order as keras-hub's.
"""

import sys
import threading
from contextlib import ExitStack, contextmanager

from keras_layers.export import compat

_QWEN3_5 = "keras_hub.src.models.qwen3_5.qwen3_5_gated_delta_net"
_RWKV7 = "keras_hub.src.models.rwkv7.rwkv7_layer"
# The attributes where each RWKV7TimeMix keeps the function it runs.
RWKV7_OPS = ("RWKV7_OP", "RWKV7_OP_RNN", "RWKV7_OP_INFERENCE")


def _module(name: str):
    """The keras-hub module if it is imported already: a model with its
    layers has imported it, and a model without them need not."""
    return sys.modules.get(name)


def _delta_rule_in_chunks(module):
    """keras-hub's chunked gated delta rule, its chunk loop a `while_loop`."""
    from keras import ops

    l2norm = module._l2norm

    def rule(
        query,
        key,
        value,
        g,
        beta,
        chunk_size=64,
        initial_state=None,
        output_final_state=False,
        padding_mask=None,
    ):
        del padding_mask  # keras-hub's rule does not read it either
        heads_first = (0, 2, 1, 3)
        input_dtype = value.dtype
        query, key = (ops.transpose(l2norm(x, axis=-1), heads_first) for x in (query, key))
        value = ops.transpose(value, heads_first)
        beta, g = (ops.transpose(x, (0, 2, 1)) for x in (beta, g))
        query, key, value, beta, g = (ops.cast(x, "float32") for x in (query, key, value, beta, g))
        batch, heads, length, k_dim = (ops.shape(key)[i] for i in range(4))
        v_dim = ops.shape(value)[3]
        if initial_state is None:
            state = ops.zeros((batch, heads, k_dim, v_dim), dtype="float32")
        else:
            state = ops.cast(initial_state, "float32")
        output, state = _over_chunks(*_in_chunks(query, key, value, g, beta, chunk_size), state)
        output = ops.reshape(output, (batch, heads, -1, v_dim))[:, :, :length, :]
        output = ops.cast(ops.transpose(output, heads_first), input_dtype)
        return output, (state if output_final_state else None)

    return rule


def _in_chunks(query, key, value, g, beta, chunk_size: int) -> tuple:
    """The per-chunk terms of the rule, `(batch, heads, chunks, chunk, ...)`:
    queries, keys, the values and key decays solved within each chunk, the
    cumulative gates and the decay mask. The sequence is padded to whole
    chunks, a no-op at a multiple of the chunk (keras-hub branches on it)."""
    from keras import ops

    batch, heads, length, k_dim = (ops.shape(key)[i] for i in range(4))
    v_dim = ops.shape(value)[3]
    pad = (chunk_size - length % chunk_size) % chunk_size
    query, key, value = (
        ops.pad(x, [[0, 0], [0, 0], [0, pad], [0, 0]]) for x in (query, key, value)
    )
    beta, g = (ops.pad(x, [[0, 0], [0, 0], [0, pad]]) for x in (beta, g))
    chunks = (length + pad) // chunk_size

    query = query * (1.0 / (k_dim**0.5))
    v_beta = value * ops.expand_dims(beta, -1)
    k_beta = key * ops.expand_dims(beta, -1)

    def split(x, width):
        return ops.reshape(x, (batch, heads, chunks, chunk_size, width))

    query, key, value = split(query, k_dim), split(key, k_dim), split(value, v_dim)
    k_beta, v_beta = split(k_beta, k_dim), split(v_beta, v_dim)
    g = ops.cumsum(ops.reshape(g, (batch, heads, chunks, chunk_size)), axis=-1)

    upper = ops.triu(ops.ones((chunk_size, chunk_size)), k=0)
    lower = ops.transpose(upper, (1, 0))
    decay = ops.exp((ops.expand_dims(g, -1) - ops.expand_dims(g, -2)) * lower) * lower
    attn = -(ops.einsum("bhcid,bhcjd->bhcij", k_beta, key) * decay)
    attn = _solved(ops.where(ops.cast(upper, "bool"), ops.zeros_like(attn), attn), chunk_size)
    value = ops.einsum("bhcij,bhcjd->bhcid", attn, v_beta)
    k_cumdecay = ops.einsum("bhcij,bhcjd->bhcid", attn, k_beta * ops.expand_dims(ops.exp(g), -1))
    return query, key, value, k_cumdecay, g, decay, chunks


def _solved(attn, chunk_size: int):
    """keras-hub's in-chunk triangular solve: row i gains row i (left of i)
    times the rows above it, in order, then the identity is added. Its
    length is the chunk's, a constant, so it stays unrolled: the same
    products in the same order."""
    from keras import ops

    for i in range(1, chunk_size):
        correction = ops.matmul(attn[..., i : i + 1, :i], attn[..., :i, :i])
        row = attn[..., i : i + 1, :] + ops.pad(
            correction, [[0, 0], [0, 0], [0, 0], [0, 0], [0, chunk_size - i]]
        )
        attn = ops.concatenate([attn[..., :i, :], row, attn[..., i + 1 :, :]], axis=-2)
    return attn + ops.eye(chunk_size)


def _over_chunks(query, key, value, k_cumdecay, g, decay, chunks, state) -> tuple:
    """The recurrence across chunks as a `tf.while_loop`: each chunk's output
    `(chunks, ...)` reordered to `(batch, heads, chunks, chunk, v)`, and the
    final state."""
    import tensorflow as tf
    from keras import ops

    chunk_size = decay.shape[-1]
    strictly_upper = ops.cast(ops.triu(ops.ones((chunk_size, chunk_size)), k=1), "bool")

    def step(index, state, outputs):
        q, k, v = query[:, :, index], key[:, :, index], value[:, :, index]
        g_i, decay_i = g[:, :, index], decay[:, :, index]
        intra = ops.einsum("bhid,bhjd->bhij", q, k) * decay_i
        intra = ops.where(strictly_upper, ops.zeros_like(intra), intra)
        v_new = v - ops.einsum("bhid,bhdv->bhiv", k_cumdecay[:, :, index], state)
        inter = ops.einsum("bhid,bhdv->bhiv", q * ops.expand_dims(ops.exp(g_i), -1), state)
        outputs = outputs.write(index, inter + ops.einsum("bhij,bhjd->bhid", intra, v_new))
        g_last = g_i[..., -1]
        weighted = k * ops.expand_dims(ops.exp(ops.expand_dims(g_last, -1) - g_i), -1)
        state = state * ops.exp(ops.expand_dims(ops.expand_dims(g_last, -1), -1)) + ops.einsum(
            "bhid,bhiv->bhdv", weighted, v_new
        )
        return index + 1, state, outputs

    _, state, outputs = tf.while_loop(
        lambda index, *_: index < chunks,
        step,
        (tf.constant(0), state, tf.TensorArray("float32", size=chunks)),
    )
    return ops.transpose(outputs.stack(), (1, 2, 0, 3, 4)), state


def _delta_rule_over_steps(module):
    """keras-hub's RWKV-7 generalized delta rule, its step loop a `while_loop`."""
    import tensorflow as tf
    from keras import ops

    heads = module.transpose_head

    def rule(r, w, k, v, a, b, initial_state=None, output_final_state=True, head_first=False):
        dtype = r.dtype
        batch, length, count, size = ops.shape(r)
        r, k, v, a, b, w = (heads(x, head_first) for x in (r, k, v, a, b, w))
        w = ops.exp(-ops.exp(w))
        if initial_state is None:
            state = ops.zeros((batch, count, size, size))
        else:
            state = ops.broadcast_to(initial_state, (batch, count, size, size))
        state = ops.cast(state, "float32")

        def step(t, state, out):
            kk = ops.reshape(k[:, t, :], (batch, count, 1, size))
            rr = ops.reshape(r[:, t, :], (batch, count, size, 1))
            vv = ops.reshape(v[:, t, :], (batch, count, size, 1))
            aa = ops.reshape(a[:, t, :], (batch, count, size, 1))
            bb = ops.reshape(b[:, t, :], (batch, count, 1, size))
            state = state * w[:, t, :, None, :] + state @ aa @ bb + vv @ kk
            out = out.write(t, ops.reshape(ops.cast(state @ rr, dtype), (batch, count, size)))
            return t + 1, state, out

        _, state, out = tf.while_loop(
            lambda t, *_: t < length,
            step,
            (tf.constant(0), state, tf.TensorArray(dtype, size=length)),
        )
        out = ops.cast(ops.transpose(out.stack(), [1, 0, 2, 3]), dtype)
        return (out, state) if output_final_state else out

    return rule


def _forwarder(module):
    """Calls the module's `rnn_generalized_delta_rule` as it is at call time:
    `compat.patched` swaps that for the exporting thread alone."""

    def forward(*args, **kwargs):
        return module.rnn_generalized_delta_rule(*args, **kwargs)

    return forward


# Forwarders installed on RWKV7TimeMix layers: (id(layer), attribute) ->
# [layer, the original, how many exports use it]. Two threads exporting one
# model share a forwarder; the last to finish puts the original back.
_routers: dict = {}
_routers_lock = threading.Lock()


@contextmanager
def _rwkv7_ops_routed(model, module):
    """Point each RWKV7TimeMix of `model` that runs keras-hub's rule at the
    module's attribute (the layer keeps the function on itself, so a swap of
    the module's attribute would not reach it), swap that attribute for the
    looped rule in this thread, and put everything back after."""
    original = compat.original(module, "rnn_generalized_delta_rule")
    forwarder = _forwarder(module)
    layers = model._flatten_layers(include_self=True) if hasattr(model, "_flatten_layers") else ()
    used = []
    with _routers_lock:
        for layer in layers:
            if not isinstance(layer, module.RWKV7TimeMix):
                continue
            for name in RWKV7_OPS:
                key = (id(layer), name)
                if key in _routers:
                    _routers[key][2] += 1
                elif layer.__dict__.get(name) is original:
                    _routers[key] = [layer, original, 1]
                    object.__setattr__(layer, name, forwarder)
                else:
                    continue  # another rule (rwkv_ops' kernels): left as it is
                used.append(key)
    try:
        with compat.patched(module, "rnn_generalized_delta_rule", _delta_rule_over_steps(module)):
            yield
    finally:
        with _routers_lock:
            for key in used:
                entry = _routers[key]
                entry[2] -= 1
                if entry[2] == 0:
                    object.__setattr__(entry[0], key[1], entry[1])
                    del _routers[key]


@contextmanager
def python_loops_as_graph_loops(model):
    """For one trace of `model`, keras-hub's Python loops over the sequence
    run as `tf.while_loop`s (see the module's docstring). Other threads, and
    models without these layers, keep keras-hub's code."""
    with ExitStack() as stack:
        qwen = _module(_QWEN3_5)
        if qwen is not None and hasattr(qwen, "_chunk_gated_delta_rule"):
            stack.enter_context(
                compat.patched(qwen, "_chunk_gated_delta_rule", _delta_rule_in_chunks(qwen))
            )
        rwkv = _module(_RWKV7)
        if rwkv is not None and hasattr(rwkv, "rnn_generalized_delta_rule"):
            stack.enter_context(_rwkv7_ops_routed(model, rwkv))
        yield
