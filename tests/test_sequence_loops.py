"""keras-hub's Python loops over the sequence, traced as graph loops.

Qwen3.5's gated delta net and RWKV-7's time mixing loop in Python over the
length (keras_layers/export/sequence_loops.py). The looped rules are traced
with a free length and checked against two oracles: keras-hub's own rule run
eagerly, and the recurrence written from the papers in NumPy (Gated Delta
Networks, Yang et al. 2024, eq. 10; RWKV-7, Peng et al. 2025, eq. 17). The
lengths cross Qwen3.5's 64-token chunks. The exports are proved by the
pipeline's validation, and a rule broken on purpose must fail it.
"""

import threading

import numpy as np
import pytest
from keras_hub.src.models.qwen3_5 import qwen3_5_gated_delta_net as qwen3_5
from keras_hub.src.models.rwkv7 import rwkv7_layer as rwkv7

from keras_layers.export import sequence_loops
from keras_layers.export.errors import ValidationFailed

pytestmark = pytest.mark.tensorflow_only

LENGTHS = [1, 5, 64, 70, 130]


def _l2normed(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def gated_delta_rule(query, key, value, g, beta, state):
    """S_t = S_{t-1} e^{g_t} + k_t (beta_t (v_t - k_t S_{t-1} e^{g_t}))^T,
    o_t = q_t S_t, over (batch, length, heads, ...) rows, queries and keys
    L2-normalised and the queries scaled by 1 / sqrt(key width)."""
    query = _l2normed(query) / np.sqrt(query.shape[-1])
    key = _l2normed(key)
    state = state.astype(np.float64).copy()
    out = np.zeros(value.shape, np.float64)
    for t in range(query.shape[1]):
        state *= np.exp(g[:, t])[..., None, None]
        remembered = np.einsum("bhk,bhkv->bhv", key[:, t], state)
        delta = beta[:, t][..., None] * (value[:, t] - remembered)
        state += np.einsum("bhk,bhv->bhkv", key[:, t], delta)
        out[:, t] = np.einsum("bhk,bhkv->bhv", query[:, t], state)
    return out, state


def generalized_delta_rule(r, w, k, v, a, b, state):
    """S_t = S_{t-1} (diag(exp(-exp(w_t))) + a_t b_t^T) + v_t k_t^T,
    o_t = S_t r_t, over (batch, length, heads, width) rows."""
    decay = np.exp(-np.exp(w.astype(np.float64)))
    state = state.astype(np.float64).copy()
    out = np.zeros(r.shape, np.float64)
    for t in range(r.shape[1]):
        state = (
            state * decay[:, t, :, None, :]
            + np.einsum("bhij,bhj,bhk->bhik", state, a[:, t], b[:, t])
            + np.einsum("bhi,bhj->bhij", v[:, t], k[:, t])
        )
        out[:, t] = np.einsum("bhij,bhj->bhi", state, r[:, t])
    return out, state


def _traced(rule, arrays, **kwargs):
    """`rule` traced with every axis but the last free, then run on `arrays`."""
    import tensorflow as tf

    specs = [tf.TensorSpec([None] * (x.ndim - 1) + [x.shape[-1]], tf.float32) for x in arrays]
    function = tf.function(lambda *xs: rule(*xs, **kwargs), input_signature=specs, autograph=False)
    return [np.asarray(x) for x in function(*arrays)]


@pytest.mark.parametrize("length", LENGTHS)
def test_the_looped_gated_delta_rule_is_keras_hubs_and_the_recurrence(length):
    rng = np.random.default_rng(length)
    batch, heads, k_dim, v_dim = 2, 2, 4, 3
    query, key = (rng.normal(size=(batch, length, heads, k_dim)).astype("float32") for _ in "qk")
    value = rng.normal(size=(batch, length, heads, v_dim)).astype("float32")
    g = -rng.uniform(0.01, 1.0, (batch, length, heads)).astype("float32")
    beta = rng.uniform(0, 1, (batch, length, heads)).astype("float32")
    state = rng.normal(size=(batch, heads, k_dim, v_dim)).astype("float32")
    arrays = (query, key, value, g, beta, state)

    looped = sequence_loops._delta_rule_in_chunks(qwen3_5)
    got, got_state = _traced(
        lambda q, k, v, g, b, s: looped(q, k, v, g, b, initial_state=s, output_final_state=True),
        arrays,
    )
    eager, eager_state = qwen3_5._chunk_gated_delta_rule(
        query, key, value, g, beta, initial_state=state, output_final_state=True
    )
    np.testing.assert_allclose(got, np.asarray(eager), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_state, np.asarray(eager_state), rtol=1e-5, atol=1e-5)
    expected, expected_state = gated_delta_rule(*arrays)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_state, expected_state, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length", LENGTHS)
def test_the_looped_generalized_delta_rule_is_keras_hubs_and_the_recurrence(length):
    rng = np.random.default_rng(length)
    shape = (2, length, 2, 4)
    r, k, v = (rng.normal(size=shape).astype("float32") for _ in "rkv")
    w = rng.normal(-1, 0.5, shape).astype("float32")
    kk = _l2normed(rng.normal(size=shape)).astype("float32")
    a, b = -kk, (kk * rng.uniform(0, 1, shape)).astype("float32")  # as RWKV7TimeMix passes them
    state = rng.normal(size=(2, 2, 4, 4)).astype("float32")

    looped = sequence_loops._delta_rule_over_steps(rwkv7)
    got, got_state = _traced(
        lambda *xs: looped(*xs[:6], initial_state=xs[6], output_final_state=True),
        (r, w, k, v, a, b, state),
    )
    eager, eager_state = rwkv7.rnn_generalized_delta_rule(r, w, k, v, a, b, initial_state=state)
    np.testing.assert_allclose(got, np.asarray(eager), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_state, np.asarray(eager_state), rtol=1e-5, atol=1e-5)
    expected, expected_state = generalized_delta_rule(r, w, k, v, a, b, state)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_state, expected_state, rtol=1e-4, atol=1e-4)


def test_the_rwkv7_route_is_per_thread_and_put_back():
    """Each RWKV7TimeMix keeps its rule on itself: inside the block this
    thread gets the looped rule, another thread keras-hub's, and after the
    last block the layer holds keras-hub's function again."""
    import keras

    layer = rwkv7.RWKV7TimeMix(16, 8, gate_lora=4, mv_lora=4, aaa_lora=4, decay_lora=4)
    model = keras.Sequential([layer])
    original = layer.RWKV7_OP_INFERENCE
    assert original is rwkv7.rnn_generalized_delta_rule
    seen = {}
    with sequence_loops.python_loops_as_graph_loops(model):
        route = layer.RWKV7_OP_INFERENCE
        assert route is not original
        thread = threading.Thread(target=lambda: seen.update(other=_eager_rows(route)))
        thread.start()
        thread.join()
        # A second export of the same model (another thread's, overlapping)
        # shares the route; the first to finish leaves it in place.
        with sequence_loops.python_loops_as_graph_loops(model):
            assert layer.RWKV7_OP_INFERENCE is route
        assert layer.RWKV7_OP_INFERENCE is route
    assert seen["other"] == "ran"  # keras-hub's Python loop runs eagerly on numbers
    assert all(getattr(layer, name) is original for name in sequence_loops.RWKV7_OPS)
    assert sequence_loops._routers == {}


def _eager_rows(route):
    import tensorflow as tf

    x = np.ones((1, 3, 2, 4), "float32")
    outputs, _ = route(*(tf.constant(x),) * 6)
    assert isinstance(outputs, tf.Tensor) and outputs.shape == (1, 3, 2, 4)
    return "ran"


def _tiny(name):
    import zoo_models

    return zoo_models.build(name)


@pytest.mark.slow  # two exports of a tiny RWKV-7, 30 s
def test_a_broken_loop_fails_the_proof_and_the_right_one_passes(tmp_path, monkeypatch):
    """The validation compares the file with keras-hub's own eager layer, not
    with the looped rule: a rule that forgets the decay on every step is
    traced, converted, and refused."""
    from keras_layers.export import ExportOptions, export_model

    model = _tiny("RWKV7Backbone")
    report = export_model(model, tmp_path / "good.onnx", ExportOptions())
    assert report["passed"] and any(c["shape"] == "padded" for c in report["checks"])
    assert all(
        getattr(layer, name) is rwkv7.rnn_generalized_delta_rule
        for layer in model._flatten_layers()
        if isinstance(layer, rwkv7.RWKV7TimeMix)
        for name in sequence_loops.RWKV7_OPS
    )

    right = sequence_loops._delta_rule_over_steps

    def forgetful(module):
        rule = right(module)
        return lambda r, w, *rest, **kw: rule(r, w * 0 - 30.0, *rest, **kw)  # decay 1

    monkeypatch.setattr(sequence_loops, "_delta_rule_over_steps", forgetful)
    with pytest.raises(ValidationFailed):
        export_model(model, tmp_path / "broken.onnx", ExportOptions())


def test_a_layer_looping_with_keras_fori_loop_over_the_length_exports(tmp_path):
    """What docs/export.md tells a user whose own layer loops in Python over
    the length: written with `keras.ops.fori_loop`, it traces as an ONNX
    `Loop` and is proved at every length of the grid."""
    import keras
    import onnx

    from keras_layers.export import ExportOptions, export_model

    @keras.saving.register_keras_serializable(package="tests")
    class DecayingSum(keras.layers.Layer):
        """h_t = 0.9 h_{t-1} + x_t over the sequence, a running state."""

        def call(self, x):
            ops = keras.ops
            steps = ops.transpose(x, (1, 0, 2))

            def step(t, carry):
                state, out = carry
                state = 0.9 * state + steps[t]
                return state, ops.slice_update(out, [t, 0, 0], state[None])

            _, out = ops.fori_loop(
                0, ops.shape(steps)[0], step, (ops.zeros_like(steps[0]), ops.zeros_like(steps))
            )
            return ops.transpose(out, (1, 0, 2))

    inputs = keras.Input((None, 4), name="x")
    model = keras.Model(inputs, keras.layers.Dense(3)(DecayingSum()(inputs)))
    report = export_model(model, tmp_path / "m.onnx", ExportOptions(shapes=[(1, 1), (2, 9)]))
    assert report["passed"], report["worst"]
    assert "Loop" in {node.op_type for node in onnx.load(tmp_path / "m.onnx").graph.node}
