"""Whether a tokenizer's ids fit the model it is exported with.

A token id is a row of the model's token embedding. A tokenizer whose ids
reach past the rows (a vocabulary saved with another model, or ids far
apart) gives the model ids it has no row for: Keras fails deep in the
embedding lookup (TensorFlow's `InvalidArgumentError`), and ids in the
billions make a reader allocate a table as long (`std::bad_alloc`). So the
ids are compared with the rows first, before any file is written.
"""

from keras_layers.export.errors import UsageError
from keras_layers.export.tokenizer_files.exporting import resolve


def largest_id(tokenizer) -> int | None:
    """The largest id of a keras-hub tokenizer's vocabulary.

    Args:
        tokenizer: a keras-hub tokenizer.

    Returns:
        The largest id (a BPE vocabulary maps tokens to ids that need not be
        consecutive; the other families number their tokens from 0), or
        None for an empty vocabulary.
    """
    vocabulary = getattr(tokenizer, "vocabulary", None)
    if isinstance(vocabulary, dict):
        return max((int(value) for value in vocabulary.values()), default=None)
    size = int(tokenizer.vocabulary_size() or 0)
    return size - 1 if size > 0 else None


def embedding_rows(model) -> int | None:
    """The rows of a keras-hub task's token embedding (its backbone's
    `token_embedding`, else `vocabulary_size`), or None where it has none.

    Args:
        model: a keras-hub task (or any model).

    Returns:
        The number of token ids the model takes, or None.
    """
    backbone = getattr(model, "backbone", None)
    rows = getattr(getattr(backbone, "token_embedding", None), "input_dim", None)
    rows = getattr(backbone, "vocabulary_size", None) if rows is None else rows
    return int(rows) if isinstance(rows, int) and rows > 0 else None


def check_ids_fit(tokenizer_or_preprocessor, rows: int, model: str) -> None:
    """Refuse a tokenizer whose ids reach past a model's embedding rows.

    Args:
        tokenizer_or_preprocessor: a keras-hub tokenizer or preprocessor.
        rows: the model's token embedding rows (the ids it takes).
        model: what to call the model in the message.

    Raises:
        UsageError: the tokenizer's largest id is `rows` or more.
    """
    tokenizer, _ = resolve(tokenizer_or_preprocessor)
    largest = largest_id(tokenizer)
    if largest is not None and largest >= rows:
        raise UsageError(
            f"the {type(tokenizer).__name__}'s ids reach {largest}, past the {rows} rows of "
            f"{model}'s token embedding: the tokenizer and the model do not match (an id past "
            "the rows has no embedding); save the model with its own tokenizer"
        )
