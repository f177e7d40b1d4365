"""keras.io "Image classification from scratch" (fchollet), adapted.

The example's `make_model`, a small Xception: `Rescaling(1.0 / 255)` of raw
pixels, a strided `Conv2D` entry block with `BatchNormalization`, then blocks
of two `SeparableConv2D` and a strided `MaxPooling2D`, each added to a strided
1x1 `Conv2D` projection of the block's input (`layers.add`), a last
`SeparableConv2D`, `GlobalAveragePooling2D`, `Dropout(0.5)` and, for two
classes, one sigmoid unit. RGB images of a fixed size; the data augmentation
runs on the dataset, outside the model (the example's option 2).
"""

import keras
from keras import layers

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/vision/image_classification_from_scratch/"
NOTES = (
    "image_size (32, 32) instead of (180, 180); entry filters 8 and 16 (32, 64 in the "
    "example), blocks [16, 32] (the example: [128, 256, 512, 728]) and a last "
    "SeparableConv2D of 64 (1024); trained 2 steps of 16 random pixels in [0, 255] "
    "with random labels instead of Cats vs Dogs, without the dataset's augmentation "
    "(RandomFlip, RandomRotation, outside the model there too)."
)

image_size = (32, 32)
ENTRY_FILTERS = (8, 16)
BLOCK_SIZES = [16, 32]
LAST_FILTERS = 64


def make_model(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)

    # Entry block
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Conv2D(ENTRY_FILTERS[0], 3, strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)

    x = layers.Conv2D(ENTRY_FILTERS[1], 3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)

    previous_block_activation = x  # Set aside residual

    for size in BLOCK_SIZES:
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)

        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)

        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)

        # Project residual
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous_block_activation)
        x = layers.add([x, residual])  # Add back residual
        previous_block_activation = x  # Set aside next residual

    x = layers.SeparableConv2D(LAST_FILTERS, 3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)

    x = layers.GlobalAveragePooling2D()(x)
    if num_classes == 2:
        activation = "sigmoid"
        units = 1
    else:
        activation = "softmax"
        units = num_classes

    x = layers.Dropout(0.5)(x)
    outputs = layers.Dense(units, activation=activation)(x)
    return keras.Model(inputs, outputs)


def training_data():
    """(x, y) of two batches: raw pixels in [0, 255], as `image_dataset_from_directory`
    yields them, and binary labels."""
    data = synthetic.rng()
    pixels = data.uniform(0.0, 255.0, size=(32, *image_size, 3)).astype("float32")
    return pixels, synthetic.labels(data, (32, 1), 2).astype("float32")


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = make_model(input_shape=image_size + (3,), num_classes=2)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="binary_crossentropy",
        metrics=["accuracy"],
        jit_compile=True,  # Enable XLA compilation for faster execution
    )
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
