import keras
import numpy as np
import pytest
import references as ref
from arrays import as_numpy

from keras_layers import ScaledEmbedding, TiedOutputDense, clone_model_keeping_ties

VOCAB, WIDTH = 40, 8


def tied_model(embedding=None, **head_kwargs):
    ids = keras.Input((None,), dtype="int32", name="ids")
    embedding = embedding or ScaledEmbedding(VOCAB, WIDTH, mask_zero=True, name="emb")
    hidden = keras.layers.Dense(WIDTH, name="mix")(embedding(ids))
    logits = TiedOutputDense(embedding, name="head", **head_kwargs)(hidden)
    return keras.Model(ids, logits)


def test_correctness_on_a_hand_checked_case():
    embedding = keras.layers.Embedding(3, 2)
    embedding.build()
    embedding.embeddings.assign(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    head = TiedOutputDense(embedding)
    np.testing.assert_array_equal(as_numpy(head(np.array([[2.0, 3.0]]))), [[2.0, 3.0, 5.0]])


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"use_bias": True, "bias_initializer": "random_normal"},
        {"logit_scale": WIDTH**-0.5},
        {"logit_soft_cap": 3.0},
        {"use_bias": True, "logit_scale": 2.0, "logit_soft_cap": 5.0},
    ],
)
def test_logits_match_the_numpy_reference(kwargs):
    embedding = keras.layers.Embedding(VOCAB, WIDTH, embeddings_initializer="normal")
    head = TiedOutputDense(embedding, **kwargs)
    hidden = np.random.default_rng(0).normal(size=(2, 5, WIDTH)).astype("float32")
    out = as_numpy(head(hidden))
    bias = as_numpy(head.bias) if head.use_bias else None
    expected = ref.tied_logits(
        hidden,
        embedding.embeddings,
        bias,
        kwargs.get("logit_scale"),
        kwargs.get("logit_soft_cap"),
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    if "logit_soft_cap" in kwargs:
        assert np.abs(out).max() < kwargs["logit_soft_cap"]


def test_shares_the_variable_never_a_copy():
    model = tied_model()
    emb, head = model.get_layer("emb"), model.get_layer("head")
    assert head.embedding is emb
    paths = [w.path for w in model.weights]
    assert paths.count("emb/embeddings") == 1
    assert len(paths) == len(set(paths)) == 3  # embeddings, mix kernel, mix bias
    ids = np.array([[1, 2, 3]])
    before = as_numpy(model(ids))
    emb.embeddings.assign(emb.embeddings * 2.0)
    # Doubling E doubles the input side and the output side: logits change.
    assert not np.allclose(as_numpy(model(ids)), before)


@pytest.mark.parametrize("kind", ["embedding", "scaled", "reversible", "keras_hub"])
def test_any_layer_with_an_embeddings_matrix(kind):
    if kind == "embedding":
        owner = embedding = keras.layers.Embedding(VOCAB, WIDTH)
    elif kind == "scaled":
        owner = embedding = ScaledEmbedding(VOCAB, WIDTH)
    elif kind == "reversible":
        owner = embedding = keras.layers.ReversibleEmbedding(VOCAB, WIDTH)
    else:
        keras_hub = pytest.importorskip("keras_hub")
        owner = keras_hub.layers.TokenAndPositionEmbedding(VOCAB, 16, WIDTH)
        embedding = owner.token_embedding
    assert not embedding.built
    head = TiedOutputDense(embedding)
    assert embedding.built  # an unbuilt embedding is built
    ids = keras.Input((None,), dtype="int32")
    model = keras.Model(ids, head(owner(ids)))
    variables = [id(w) for w in model.weights]
    assert variables.count(id(embedding.embeddings)) == 1
    logits = as_numpy(model(np.array([[1, 2, 3]])))
    assert logits.shape == (1, 3, VOCAB)


def test_width_mismatch_names_both_numbers():
    head = TiedOutputDense(keras.layers.Embedding(VOCAB, WIDTH))
    with pytest.raises(ValueError, match=r"hidden width \(5\).*\(8\)"):
        head(np.zeros((1, 2, 5), "float32"))


def test_mixed_precision_logits_are_float32_by_default(policy):
    policy("mixed_float16")
    model = tied_model()
    out = model(np.array([[1, 2, 0]]))
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    assert model.get_layer("mix").compute_dtype == "float16"
    half = TiedOutputDense(keras.layers.Embedding(VOCAB, WIDTH), logits_dtype="float16")
    out = half(np.zeros((1, WIDTH), "float16"))
    assert keras.backend.standardize_dtype(out.dtype) == "float16"


def test_mask_passes_through():
    model = tied_model()
    hidden = model.get_layer("head").output
    assert hidden._keras_mask is not None


def test_one_optimizer_step_matches_reversible_embedding():
    """Gradients from the lookup and the projection both reach the one matrix."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 10, size=(4, 6))  # rows 10.. are never looked up
    targets = rng.integers(0, VOCAB, size=(4, 6))

    ours = tied_model(embedding=keras.layers.Embedding(VOCAB, WIDTH, name="emb"))
    inp = keras.Input((None,), dtype="int32")
    reversible = keras.layers.ReversibleEmbedding(VOCAB, WIDTH, name="emb")
    mix = keras.layers.Dense(WIDTH, name="mix")
    peer = keras.Model(inp, reversible(mix(reversible(inp)), reverse=True))
    peer.set_weights(ours.get_weights())
    before = ours.get_weights()[0]

    for model in (ours, peer):
        model.compile(
            optimizer=keras.optimizers.SGD(0.5),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.train_on_batch(ids, targets)
    after_ours, after_peer = ours.get_weights(), peer.get_weights()
    np.testing.assert_allclose(after_ours[0], after_peer[0], rtol=1e-5, atol=1e-6)
    # Rows never looked up moved too: the projection's gradient reached E.
    assert np.abs(after_ours[0][10:] - before[10:]).min() > 0


def test_tie_survives_save_and_load(tmp_path):
    model = tied_model(use_bias=True)
    path = tmp_path / "tied.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects needed
    emb, head = loaded.get_layer("emb"), loaded.get_layer("head")
    assert head.embedding is emb
    assert [w.path for w in loaded.weights].count("emb/embeddings") == 1
    ids = np.array([[3, 4, 5, 0]])
    np.testing.assert_allclose(as_numpy(loaded(ids)), as_numpy(model(ids)), rtol=1e-6)
    emb.embeddings.assign(np.zeros((VOCAB, WIDTH)))
    np.testing.assert_allclose(
        as_numpy(loaded(ids)), np.broadcast_to(as_numpy(head.bias), (1, 4, VOCAB))
    )


def test_weights_h5_round_trip(tmp_path):
    model = tied_model(use_bias=True)
    path = tmp_path / "tied.weights.h5"
    model.save_weights(path)
    fresh = tied_model(use_bias=True)
    fresh.load_weights(path)
    ids = np.array([[1, 2, 3]])
    np.testing.assert_allclose(as_numpy(fresh(ids)), as_numpy(model(ids)), rtol=1e-6)
    assert fresh.get_layer("head").embedding is fresh.get_layer("emb")


def test_summary_counts_the_shared_matrix_once():
    model = tied_model()
    lines = []
    model.summary(print_fn=lambda line, **kwargs: lines.append(line))
    text = "\n".join(lines)
    total = VOCAB * WIDTH + WIDTH * WIDTH + WIDTH
    assert f"Total params: {total:,}" in text


def test_clone_model_refuses_to_untie_silently():
    model = tied_model()
    with pytest.raises(ValueError, match="clone_model_keeping_ties"):
        keras.models.clone_model(model)


def test_clone_model_keeping_ties():
    model = tied_model(use_bias=True)
    clone = clone_model_keeping_ties(model)
    assert clone.get_layer("head").embedding is clone.get_layer("emb")
    assert clone.get_layer("emb") is not model.get_layer("emb")
    assert len(clone.weights) == len(model.weights)


def test_config_round_trip():
    head = TiedOutputDense(
        keras.layers.Embedding(VOCAB, WIDTH),
        use_bias=True,
        logit_scale=0.5,
        logit_soft_cap=30.0,
        logits_dtype="float32",
    )
    config = head.get_config()
    clone = TiedOutputDense.from_config(config)
    assert clone.get_config() == config


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"embedding": "emb"}, TypeError, "`embedding` must be a Keras layer"),
        ({"embedding": None}, TypeError, "`embedding` must be a Keras layer"),
        ({"logit_scale": 0}, ValueError, "`logit_scale` must be None or a positive"),
        ({"logit_soft_cap": -1.0}, ValueError, "`logit_soft_cap` must be None"),
        ({"use_bias": "yes"}, ValueError, "`use_bias` must be True or False"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, error, message):
    args = {"embedding": keras.layers.Embedding(VOCAB, WIDTH), **kwargs}
    with pytest.raises(error, match=message):
        TiedOutputDense(**args)


def test_layer_without_embeddings_matrix_is_refused():
    dense = keras.layers.Dense(4)
    dense.build((None, 3))
    with pytest.raises(ValueError, match="must own an `embeddings` matrix"):
        TiedOutputDense(dense)


def test_an_unbuilt_dense_is_refused_on_first_call_naming_the_missing_matrix():
    """Not Keras' own "Dense.build() missing input_shape": the real problem."""
    head = TiedOutputDense(keras.layers.Dense(3))
    with pytest.raises(ValueError, match=r"Layer 'dense\w*' \(Dense\) has none"):
        head(np.zeros((1, 2, WIDTH), "float32"))
