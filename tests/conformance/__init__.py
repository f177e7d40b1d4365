"""The conformance set: Keras models written the way public example code writes them.

Each module adapts one public example (keras.io, the TensorFlow Transformer
tutorial) that nobody on this project wrote: its own layer classes, masks and
compile arguments, made tiny and trained for a few steps on synthetic data so
that the weights are not the initialiser's. The export pipeline is then judged
on models its authors did not shape for it (tests/test_conformance_models.py).

Every module exposes `SOURCE` (the original's address), `NOTES` (what was
adapted, and why) and `build() -> keras.Model`; `INPUT_ROLES`, where present,
is an input-role override the exporter cannot do without.

Custom layers are registered under `conformance.<module>`, not one shared
package: several examples name their layers alike (`TransformerBlock`,
`TokenAndPositionEmbedding`, `PositionalEmbedding`), and a shared name would
make a saved model load another example's class.
"""

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType

import keras

# In the order a reader meets the shapes: encoders, encoder-decoders, a
# decoder, recurrent and convolutional models, then models of images.
_NAMES = (
    "text_classification_transformer",
    "timeseries_classification_transformer",
    "tf_transformer_encoder",
    "tf_transformer",
    "translation_transformer",
    "miniature_gpt",
    "bidirectional_lstm_imdb",
    "text_classification_from_scratch",
    "translation_keras_hub",
    "ner_transformer",
    "masked_language_modeling_bert",
    "weather_forecasting_lstm",
    "mnist_convnet",
    "image_classification_from_scratch",
    "vision_transformer",
)


class _Modules(Mapping):
    """Name -> module, imported on first use (each pulls in TensorFlow-sized
    dependencies, and a test may want one model only)."""

    def __init__(self, names: tuple[str, ...]):
        self._names = names

    def __getitem__(self, name: str) -> ModuleType:
        if name not in self._names:
            raise KeyError(name)
        return importlib.import_module(f"{__name__}.{name}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


MODELS: Mapping[str, ModuleType] = _Modules(_NAMES)


def build(name: str) -> keras.Model:
    """The model of conformance module `name`, built, compiled and trained a few steps."""
    return MODELS[name].build()
