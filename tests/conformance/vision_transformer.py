"""keras.io "Image classification with Vision Transformer" (Khalid Salama), adapted.

RGB images of a fixed size `(32, 32, 3)` go through the model's own
`data_augmentation` (`Normalization` adapted to the training images,
`Resizing`, then `RandomFlip`, `RandomRotation` and `RandomZoom`, which pass
images through unchanged outside training); a `Patches` layer cuts them with
`keras.ops.image.extract_patches` and reshapes the patches to a sequence, a
`PatchEncoder` projects each patch (`Dense`) and adds a learned position
`Embedding` of `ops.arange(num_patches)`; pre-norm Transformer blocks
(`LayerNormalization(epsilon=1e-6)`, `MultiHeadAttention(dropout=0.1)`, a
GELU MLP), then `Flatten` and a GELU MLP head into logits.
"""

import keras
from keras import layers, ops

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/vision/image_classification_with_vision_transformer/"
NOTES = (
    "image_size 24 (the example resizes to 72), patch_size 6 as there, so 16 patches; "
    "projection_dim 16, 2 heads, 2 Transformer layers, mlp_head_units [32, 16] (the "
    "example: 64, 4, 8, [2048, 1024]); 100 classes as there. Trained 2 steps of 16 "
    "random pixels in [0, 255] instead of CIFAR-100, to which the Normalization is "
    "adapted. `Patches` and `PatchEncoder` take `**kwargs` and `PatchEncoder.get_config` "
    "returns `projection_dim`: as written, `from_config` cannot rebuild either (the "
    "saved config has `name`, `trainable` and `dtype`, which their `__init__` refuses), "
    "so the model could not be loaded back from a .keras file. The example's "
    'KERAS_BACKEND="jax" is TensorFlow here, as the export runs on it.'
)

num_classes = 100
input_shape = (32, 32, 3)

learning_rate = 0.001
weight_decay = 0.0001
image_size = 24  # We'll resize input images to this size
patch_size = 6  # Size of the patches to be extract from the input images
num_patches = (image_size // patch_size) ** 2
projection_dim = 16
num_heads = 2
hidden_dim = projection_dim * num_heads
transformer_units = [
    hidden_dim * 2,
    hidden_dim,
]  # Size of the transformer layers
transformer_layers = 2
mlp_head_units = [
    32,
    16,
]  # Size of the dense layers of the final classifier


def make_data_augmentation(x_train):
    data_augmentation = keras.Sequential(
        [
            layers.Normalization(),
            layers.Resizing(image_size, image_size),
            layers.RandomFlip("horizontal"),
            layers.RandomRotation(factor=0.02),
            layers.RandomZoom(height_factor=0.2, width_factor=0.2),
        ],
        name="data_augmentation",
    )
    # Compute the mean and the variance of the training data for normalization.
    data_augmentation.layers[0].adapt(x_train)
    return data_augmentation


def mlp(x, hidden_units, dropout_rate):
    for units in hidden_units:
        x = layers.Dense(units, activation=keras.activations.gelu)(x)
        x = layers.Dropout(dropout_rate)(x)
    return x


@keras.saving.register_keras_serializable("conformance.vision_transformer")
class Patches(layers.Layer):
    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size

    def call(self, images):
        input_shape = ops.shape(images)
        batch_size = input_shape[0]
        height = input_shape[1]
        width = input_shape[2]
        channels = input_shape[3]
        num_patches_h = height // self.patch_size
        num_patches_w = width // self.patch_size
        patches = keras.ops.image.extract_patches(images, size=self.patch_size)
        patches = ops.reshape(
            patches,
            (
                batch_size,
                num_patches_h * num_patches_w,
                self.patch_size * self.patch_size * channels,
            ),
        )
        return patches

    def get_config(self):
        config = super().get_config()
        config.update({"patch_size": self.patch_size})
        return config


@keras.saving.register_keras_serializable("conformance.vision_transformer")
class PatchEncoder(layers.Layer):
    def __init__(self, num_patches, projection_dim, **kwargs):
        super().__init__(**kwargs)
        self.num_patches = num_patches
        self.projection_dim = projection_dim
        self.projection = layers.Dense(units=projection_dim)
        self.position_embedding = layers.Embedding(input_dim=num_patches, output_dim=projection_dim)

    def call(self, patch):
        positions = ops.expand_dims(ops.arange(start=0, stop=self.num_patches, step=1), axis=0)
        projected_patches = self.projection(patch)
        encoded = projected_patches + self.position_embedding(positions)
        return encoded

    def get_config(self):
        config = super().get_config()
        config.update({"num_patches": self.num_patches, "projection_dim": self.projection_dim})
        return config


def create_vit_classifier(data_augmentation):
    inputs = keras.Input(shape=input_shape)
    # Augment data.
    augmented = data_augmentation(inputs)
    # Create patches.
    patches = Patches(patch_size)(augmented)
    # Encode patches.
    encoded_patches = PatchEncoder(num_patches, hidden_dim)(patches)

    # Create multiple layers of the Transformer block.
    for _ in range(transformer_layers):
        # Layer normalization 1.
        x1 = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
        # Create a multi-head attention layer.
        attention_output = layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=projection_dim, dropout=0.1
        )(x1, x1)
        # Skip connection 1.
        x2 = layers.Add()([attention_output, encoded_patches])
        # Layer normalization 2.
        x3 = layers.LayerNormalization(epsilon=1e-6)(x2)
        # MLP.
        x3 = mlp(x3, hidden_units=transformer_units, dropout_rate=0.1)
        # Skip connection 2.
        encoded_patches = layers.Add()([x3, x2])

    # Create a [batch_size, projection_dim] tensor.
    representation = layers.LayerNormalization(epsilon=1e-6)(encoded_patches)
    representation = layers.Flatten()(representation)
    representation = layers.Dropout(0.5)(representation)
    # Add MLP.
    features = mlp(representation, hidden_units=mlp_head_units, dropout_rate=0.5)
    # Classify outputs.
    logits = layers.Dense(num_classes)(features)
    # Create the Keras model.
    model = keras.Model(inputs=inputs, outputs=logits)
    return model


def training_data():
    """(x, y) of two batches: raw pixels in [0, 255], as CIFAR-100 loads, and labels."""
    data = synthetic.rng()
    pixels = data.uniform(0.0, 255.0, size=(32, *input_shape)).astype("float32")
    return pixels, synthetic.labels(data, (32, 1), num_classes)


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    x_train, y_train = training_data()
    model = create_vit_classifier(make_data_augmentation(x_train))
    optimizer = keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=weight_decay)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            keras.metrics.SparseTopKCategoricalAccuracy(5, name="top-5-accuracy"),
        ],
    )
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
