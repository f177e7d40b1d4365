"""The seed's model, translating: a Transformer of our layers, exported, run in ONNX Runtime.

    python examples/translate.py                  # train ~1 minute, export, translate
    python examples/translate.py --steps 40 --layers 1 --out /tmp/translator/

The TensorFlow tutorial's Transformer ("Neural machine translation with a
Transformer and Keras") with this project's layers in its embeddings and its
output: `ScaledEmbedding` (ids times sqrt(d_model), the tutorial's
`PositionalEmbedding`), `SinusoidalPositionEncoding` (its `positional_encoding`)
and `TiedOutputDense` (the output layer sharing the target embedding's
matrix, as the paper does). The attention blocks are keras-hub's
`TransformerEncoder` and `TransformerDecoder`, which keep a key/value cache.

The corpus is synthetic, so the script runs anywhere without a download: toy
Portuguese sentences and their English translations ("o gato preto vê um
rato" -> "the black cat sees a mouse"), with the adjective moving before its
noun, so the decoder has to look back at the right source word. 400
training steps (batches of 64) take under a minute on two cores, and the
model then translates sentences it never saw in training.

`Translator` follows the encoder-decoder protocol that `--task seq2seq-lm`
reads (docs/generation.md, "A plain Keras encoder-decoder"): `call_encoder`,
`call_decoder_with_cache`, `_initialize_cache`, and the start, end and pad
ids as attributes. The export writes the folder and proves it against the
model itself; then the script translates held-out sentences twice:

- in Keras, the tutorial's way: the whole model run again on the growing
  output at every step, the last position's argmax appended (no cache);
- in ONNX Runtime, `keras_layers.export.generate` on the folder: the encoder
  once, then one cached decoder step per token, no TensorFlow.

It prints both and exits 1 if any token differs.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense  # noqa: E402

PAD, START, END = 0, 1, 2
SPECIALS = ["<pad>", "<s>", "</s>"]
# (Portuguese, English) pairs by part of speech.
NOUNS = [("gato", "cat"), ("cão", "dog"), ("pássaro", "bird"), ("peixe", "fish"), ("rato", "mouse")]
ADJECTIVES = [
    ("preto", "black"),
    ("branco", "white"),
    ("pequeno", "small"),
    ("grande", "big"),
    ("rápido", "fast"),
]
DETERMINERS = [("o", "the"), ("um", "a")]
VERBS = [("come", "eats"), ("vê", "sees"), ("segue", "follows"), ("ama", "loves")]
WORDS = DETERMINERS + NOUNS + ADJECTIVES + VERBS
SOURCE_WORDS = SPECIALS + [pt for pt, _ in WORDS]
TARGET_WORDS = SPECIALS + [en for _, en in WORDS]
TRAINING_PAIRS = 4000  # of the 14,400 sentences the grammar makes
LONGEST = 9  # words of the longest sentence (two noun phrases of three, and the verb) + 2


def phrase(rng) -> tuple[list, list]:
    """A noun phrase: determiner, noun and maybe an adjective, which
    Portuguese puts after the noun and English before it."""
    (det_pt, det_en), (noun_pt, noun_en) = DETERMINERS[rng.integers(2)], NOUNS[rng.integers(5)]
    if rng.random() < 0.5:
        return [det_pt, noun_pt], [det_en, noun_en]
    adj_pt, adj_en = ADJECTIVES[rng.integers(5)]
    return [det_pt, noun_pt, adj_pt], [det_en, adj_en, noun_en]


def sentence_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    """`count` (Portuguese, English) sentence pairs: subject, verb, object."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        (subject_pt, subject_en), (object_pt, object_en) = phrase(rng), phrase(rng)
        verb_pt, verb_en = VERBS[rng.integers(4)]
        pairs.append(
            (
                " ".join(subject_pt + [verb_pt] + object_pt),
                " ".join(subject_en + [verb_en] + object_en),
            )
        )
    return pairs


def encode(sentences: list[str], words: list[str], framed: bool) -> tuple:
    """Ids right-padded to one length, and their mask; `framed` adds the
    start and end tokens (the decoder's training input and labels)."""
    index = {word: i for i, word in enumerate(words)}
    rows = [[index[word] for word in sentence.split()] for sentence in sentences]
    if framed:
        rows = [[START, *row, END] for row in rows]
    ids = np.full((len(rows), max(map(len, rows))), PAD, "int32")
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids, ids != PAD


def decode(rows, words: list[str] = TARGET_WORDS) -> list[str]:
    """Token ids back to words, up to the end token."""
    return [
        " ".join(words[token] for token in until_end(row) if token not in (START, END))
        for row in rows
    ]


def until_end(row) -> list[int]:
    """A row's tokens up to its end token, included."""
    row = [int(token) for token in row]
    return row[: row.index(END) + 1] if END in row else row


@keras.saving.register_keras_serializable(package="translate")
class Translator(keras.Model):
    """An encoder-decoder Transformer, the tutorial's, with our embedding,
    position and output layers and keras-hub's cached attention blocks.

    Called on keras-hub's dict (`encoder_token_ids`, `encoder_padding_mask`,
    `decoder_token_ids`, `decoder_padding_mask`) it returns the decoder's
    logits for every position (training, and the tutorial's uncached greedy
    loop). The methods below are the protocol `--task seq2seq-lm` exports.

    Args:
        source_vocabulary: ids the encoder reads.
        target_vocabulary: ids the decoder reads and writes.
        width: d_model.
        layers: encoder layers, and as many decoder layers.
        heads: attention heads (width divisible by them).
        intermediate: the feed-forward width.
        **kwargs: `keras.Model`'s.
    """

    decoder_start_token_ids = (START,)
    end_token_id = END
    pad_token_id = PAD

    def __init__(
        self, source_vocabulary, target_vocabulary, width=64, layers=2, heads=4,
        intermediate=128, **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.source_vocabulary, self.target_vocabulary = source_vocabulary, target_vocabulary
        self.width, self.layers_count, self.heads = width, layers, heads
        self.intermediate = intermediate
        self.source_embedding = ScaledEmbedding(source_vocabulary, width, name="source_embedding")
        self.target_embedding = ScaledEmbedding(target_vocabulary, width, name="target_embedding")
        self.positions = SinusoidalPositionEncoding(name="positions")
        self.encoder_blocks = [
            keras_hub.layers.TransformerEncoder(intermediate, heads, name=f"encoder_{i}")
            for i in range(layers)
        ]
        self.decoder_blocks = [
            keras_hub.layers.TransformerDecoder(intermediate, heads, name=f"decoder_{i}")
            for i in range(layers)
        ]
        self.output_logits = TiedOutputDense(self.target_embedding, name="logits")

    def call(self, inputs):
        hidden = self.call_encoder(inputs["encoder_token_ids"], inputs["encoder_padding_mask"])
        x = self.positions(self.target_embedding(inputs["decoder_token_ids"]))
        for block in self.decoder_blocks:
            x = block(
                x,
                hidden,
                decoder_padding_mask=inputs["decoder_padding_mask"],
                encoder_padding_mask=inputs["encoder_padding_mask"],
            )
        return self.output_logits(x)

    def call_encoder(self, token_ids, padding_mask):
        """The encoder's output (batch, length, width) for padded ids."""
        x = self.positions(self.source_embedding(token_ids))
        for block in self.encoder_blocks:
            x = block(x, padding_mask=padding_mask)
        return x

    def call_decoder_with_cache(
        self,
        encoder_hidden_states,
        encoder_padding_mask,
        decoder_token_ids,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        cross_attention_cache_update_index=None,
    ):
        """The decoder on new tokens with both caches (stacked by layer, as
        keras-hub's `Seq2SeqLM`s keep them): the self-attention cache written
        at `self_attention_cache_update_index`; the cross-attention one
        computed from the encoder's output when its index is 0, read when None.

        Returns:
            `(logits, hidden_states, self_attention_cache, cross_attention_cache)`.
        """
        x = self.target_embedding(decoder_token_ids)
        index = self_attention_cache_update_index
        x = self.positions(x, start_index=0 if index is None else index)
        self_caches, cross_caches = [], []
        for i, block in enumerate(self.decoder_blocks):
            x, self_cache, cross_cache = block(
                decoder_sequence=x,
                encoder_sequence=encoder_hidden_states,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=self_attention_cache[:, i, ...],
                self_attention_cache_update_index=self_attention_cache_update_index,
                cross_attention_cache=cross_attention_cache[:, i, ...],
                cross_attention_cache_update_index=cross_attention_cache_update_index,
            )
            self_caches.append(self_cache)
            cross_caches.append(cross_cache)
        self_attention_cache = ops.stack(self_caches, axis=1)
        if cross_attention_cache_update_index is not None:
            cross_attention_cache = ops.stack(cross_caches, axis=1)
        return self.output_logits(x), x, self_attention_cache, cross_attention_cache

    def _initialize_cache(self, encoder_token_ids, decoder_token_ids):
        """Both caches, zero: (batch, layers, 2, length, heads, head size)."""
        batch = ops.shape(encoder_token_ids)[0]
        size = self.width // self.heads
        shape = [batch, self.layers_count, 2, None, self.heads, size]
        lengths = (ops.shape(decoder_token_ids)[1], ops.shape(encoder_token_ids)[1])
        self_cache, cross_cache = (
            ops.zeros([*shape[:3], length, *shape[4:]], self.compute_dtype) for length in lengths
        )
        return self_cache, cross_cache

    def get_config(self):
        config = super().get_config()
        config.update(
            source_vocabulary=self.source_vocabulary,
            target_vocabulary=self.target_vocabulary,
            width=self.width,
            layers=self.layers_count,
            heads=self.heads,
            intermediate=self.intermediate,
        )
        return config


def training_batches(pairs: list, batch: int, seed: int):
    """Endless (inputs, labels, weights) batches: teacher forcing, the
    decoder fed `<s> words` and taught `words </s>`."""
    rng = np.random.default_rng(seed)
    while True:
        chosen = [pairs[i] for i in rng.integers(len(pairs), size=batch)]
        source, source_mask = encode([pt for pt, _ in chosen], SOURCE_WORDS, framed=False)
        target, target_mask = encode([en for _, en in chosen], TARGET_WORDS, framed=True)
        inputs = {
            "encoder_token_ids": source,
            "encoder_padding_mask": source_mask,
            "decoder_token_ids": target[:, :-1],
            "decoder_padding_mask": target_mask[:, :-1],
        }
        yield inputs, target[:, 1:], target_mask[:, 1:].astype("float32")


def train(model: Translator, steps: int, seed: int = 0) -> float:
    """Adam, its rate decaying linearly over `steps` batches of 64; the last loss."""
    schedule = keras.optimizers.schedules.PolynomialDecay(2e-3, steps, 1e-4)
    model.compile(
        optimizer=keras.optimizers.Adam(schedule),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    batches = training_batches(sentence_pairs(TRAINING_PAIRS, seed), 64, seed)
    history = model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0)
    return float(history.history["loss"][-1])


def keras_translate(model: Translator, sentences: list[str], new_tokens: int) -> np.ndarray:
    """The tutorial's greedy loop: the whole model run on the output so far,
    the last position's argmax appended, until every row has ended."""
    source, mask = encode(sentences, SOURCE_WORDS, framed=False)
    output = np.full((len(sentences), 1), START, "int32")
    for _ in range(new_tokens):
        logits = model(
            {
                "encoder_token_ids": source,
                "encoder_padding_mask": mask,
                "decoder_token_ids": output,
                "decoder_padding_mask": np.ones(output.shape, bool),
            }
        )
        last = np.argmax(ops.convert_to_numpy(logits)[:, -1], axis=-1).astype("int32")
        ended = (output == END).any(axis=1)
        output = np.concatenate([output, np.where(ended, PAD, last)[:, None]], axis=1)
        if (ended | (last == END)).all():
            break
    return output


def onnx_translate(folder, sentences: list[str], new_tokens: int) -> np.ndarray:
    """`generate` on the exported folder: ONNX Runtime and NumPy only."""
    from keras_layers.export import generate

    source, mask = encode(sentences, SOURCE_WORDS, framed=False)
    return generate(folder, source, new_tokens, padding_mask=mask)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=400, help="training steps (default 400)")
    parser.add_argument("--layers", type=int, default=2, help="encoder and decoder layers")
    parser.add_argument("--out", help="the folder to write (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from keras_layers.export import export_model

    keras.utils.set_random_seed(args.seed)
    model = Translator(len(SOURCE_WORDS), len(TARGET_WORDS), layers=args.layers)
    loss = train(model, args.steps, args.seed)
    print(f"trained {args.steps} steps, last loss {loss:.4f}")

    seen = set(sentence_pairs(TRAINING_PAIRS, args.seed))
    unseen = [pair for pair in sentence_pairs(1000, args.seed + 1) if pair not in seen][:200]
    held_out, references = [pt for pt, _ in unseen], [en for _, en in unseen]
    keras_tokens = keras_translate(model, held_out, LONGEST)
    keras_texts = decode(keras_tokens)
    correct = sum(got == want for got, want in zip(keras_texts, references, strict=True))
    print(f"Keras translates {correct} of {len(held_out)} held-out sentences exactly")

    with tempfile.TemporaryDirectory(prefix="translator_") as scratch:
        folder = Path(args.out) if args.out else Path(scratch) / "translator"
        report = export_model(model, f"{folder}/", task="seq2seq-lm")
        print(f"exported to {folder}/: proof {'passed' if report['passed'] else 'FAILED'}")
        onnx_tokens = onnx_translate(folder, held_out, LONGEST)
    same = [until_end(a) == until_end(b) for a, b in zip(keras_tokens, onnx_tokens, strict=True)]
    shown = zip(held_out[:5], keras_texts[:5], decode(onnx_tokens[:5]), strict=True)
    for source, text, onnx_text in shown:
        print(f"  {source:<34} -> {onnx_text:<36} (Keras: {text})")
    print(f"ONNX Runtime gives Keras' tokens on {sum(same)} of {len(same)} sentences")
    return 0 if report["passed"] and all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
