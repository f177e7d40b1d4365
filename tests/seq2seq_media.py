"""Shared by the seq2seq tests of media encoders (speech, image): the zoo's
tiny model exported as a folder, and the check that must fail when the
decoder is fed a mask that hides no padding."""

from dataclasses import replace

import numpy as np

from keras_layers.export import Seq2SeqFolder, export_model, seq2seq
from keras_layers.export.validating import DEFAULT_ATOL, DEFAULT_RTOL, Validation
from tests import zoo_vision


def exported(name: str, root) -> tuple:
    """`(model, folder, report)`: the zoo's tiny `name` with `--task seq2seq-lm -o`."""
    model = zoo_vision.build(name)
    folder = root / name
    return model, folder, export_model(model, f"{folder}/", task="seq2seq-lm")


def unmasked_check(model, folder) -> tuple:
    """The decoder's check on the folder's merged decoder fed the encoder
    file's output and mask (which must pass), then every encoder position
    marked valid: whether each passed, and the encoder file's mask."""
    reference = seq2seq.decoder_references(model, seq2seq.describe(model))
    opened = Seq2SeqFolder(folder)
    hidden, mask = opened.encode(reference.encoder_ids, reference.encoder_input_mask == 1)
    fed = replace(reference, encoder_mask=mask)

    def checked(mask):
        result = Validation(atol=DEFAULT_ATOL, rtol=DEFAULT_RTOL)
        return seq2seq.check_steps(fed, opened.stepper(hidden, mask), result).passed

    return checked(mask), checked(np.ones_like(mask)), mask
