"""Image to text: keras-hub's `BLIP2Seq2SeqLM` as a `--task seq2seq-lm` folder.

BLIP-2's encoder reads an image and a prompt's ids: the image's Q-Former
queries are prepended to the prompt, so the mask the decoder's
cross-attention reads covers the queries too, and the encoder's file
returns it (`encoder_attention_mask`). `seq2seq.ImagePromptCalls` presents
BLIP-2's methods as the protocol. The folder's greedy tokens are held to
keras-hub's own `generate_step` on images and prompts of three lengths in
one padded batch.
"""

import numpy as np
import pytest

from keras_layers.export import Seq2SeqFolder, generate
from keras_layers.export.seq2seq_folder import keras_greedy
from tests import seq2seq_media

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.zoo,  # a zoo model's folder (half a minute): the zoo tier runs it
    pytest.mark.xdist_group("seq2seq_image"),  # module fixtures: one worker (loadgroup)
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return seq2seq_media.exported("BLIP2Seq2SeqLM", tmp_path_factory.mktemp("image"))


@pytest.fixture(scope="module")
def blip2(exported):
    return exported[0]


@pytest.fixture(scope="module")
def folder(exported):
    return exported[1:]


def _inputs(blip2, lengths=(6, 3), seed=5):
    rng = np.random.default_rng(seed)
    mask = np.arange(max(lengths)) < np.array(lengths)[:, None]
    ids = np.where(mask, rng.integers(1, 60, mask.shape), 0).astype("int32")
    shape = tuple(blip2.backbone.input["images"].shape[1:])
    images = rng.uniform(0, 1, (len(lengths), *shape)).astype("float32")
    return ids, mask, images


def test_the_folder_reads_images_and_the_prompt_and_returns_the_queries_mask(blip2, folder):
    path, report = folder
    assert report["passed"] and report["generation"]["ids"]["equal"]
    assert report["config"]["encoder_input"] == "image"
    roles = {entry["name"]: entry["role"] for entry in report["encoder"]["inputs"]}
    assert roles == {"input_ids": "ids", "attention_mask": "padding_mask", "images": "image"}
    ids, mask, images = _inputs(blip2)
    _cross, encoder_mask = Seq2SeqFolder(path).encode((ids, images), mask)
    queries = encoder_mask.shape[1] - ids.shape[1]
    assert queries > 0 and encoder_mask[:, :queries].all()  # the image's queries, always seen
    assert (encoder_mask[:, queries:] == mask).all()


def test_generate_on_images_and_prompts_gives_keras_hubs_greedy_tokens(blip2, folder):
    path, _ = folder
    ids, mask, images = _inputs(blip2)
    start = np.zeros((2, 1), "int32")
    feeds = {"encoder_token_ids": ids, "encoder_padding_mask": mask, "images": images}
    tokens = generate(path, {**feeds, "decoder_token_ids": start}, 6)
    assert tokens[:, 1:].tolist() == keras_greedy(blip2, (ids, images), mask, start, 6, None)


def test_the_decoder_check_fails_a_folder_that_ignores_the_prompts_padding(blip2, folder):
    passed, unmasked, mask = seq2seq_media.unmasked_check(blip2, folder[0])
    assert passed and not unmasked
    assert mask.sum(axis=1).min() < mask.shape[1]  # the prompts pad


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda feeds: feeds.pop("images"), "encoder_token_ids and images at least"),
        (lambda feeds: feeds.update(images=feeds["images"][:, :8]), r"images of shape \(2, 8"),
        (lambda feeds: feeds["images"].fill(np.nan), "images holds a NaN"),
        (lambda feeds: feeds.update(encoder_token_ids=[[1, 99, 2]] * 2), "outside the vocabulary"),
    ],
)
def test_generate_refuses_what_an_image_folder_cannot_take(blip2, folder, change, message):
    path, _ = folder
    ids, mask, images = _inputs(blip2)
    feeds = {"encoder_token_ids": ids, "images": images, "decoder_token_ids": [[0], [0]]}
    change(feeds)
    with pytest.raises(ValueError, match=message):
        generate(path, feeds, 3)


def test_generate_refuses_ids_alone_for_an_image_folder(folder):
    path, _ = folder
    with pytest.raises(ValueError, match="reads images with the prompt's ids"):
        generate(path, [[1, 2, 3]], 3)
