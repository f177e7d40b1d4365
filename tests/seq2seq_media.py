"""Shared by the seq2seq tests of media encoders (speech, image): the zoo's
tiny model exported as a folder, and the check that must fail when the
decoder is fed a mask that hides no padding."""

from dataclasses import replace

import numpy as np

from keras_layers.export import Seq2SeqFolder, export_model, seq2seq
from keras_layers.export.validating import DEFAULT_ATOL, DEFAULT_RTOL
from tests import zoo_vision


def exported(name: str, root) -> tuple:
    """`(model, folder, report)`: the zoo's tiny `name` with `--task seq2seq-lm -o`."""
    model = zoo_vision.build(name)
    folder = root / name
    return model, folder, export_model(model, f"{folder}/", task="seq2seq-lm")


def unmasked_check(model, folder) -> tuple:
    """The decoder's check fed the encoder file's keys, values and mask
    (which must pass), then every encoder position marked valid: whether
    each passed, and the encoder file's mask."""
    reference = seq2seq.decoder_references(model, seq2seq.describe(model))
    cross, mask = Seq2SeqFolder(folder).encode(
        reference.encoder_ids, reference.encoder_input_mask == 1
    )
    fed = replace(reference, cross=cross, encoder_mask=mask)
    decoder = folder / "decoder_with_past_model.onnx"
    passed = seq2seq.validate_decoder(fed, decoder, DEFAULT_ATOL, DEFAULT_RTOL).passed
    unmasked = replace(fed, encoder_mask=np.ones_like(mask))
    still = seq2seq.validate_decoder(unmasked, decoder, DEFAULT_ATOL, DEFAULT_RTOL).passed
    return passed, still, mask
