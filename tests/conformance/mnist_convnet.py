"""keras.io "Simple MNIST convnet" (fchollet), adapted.

A `keras.Sequential` of two valid `Conv2D(kernel_size=(3, 3), activation="relu")`
each followed by `MaxPooling2D(pool_size=(2, 2))`, `Flatten`, `Dropout(0.5)`
and a softmax `Dense`: grayscale images of the fixed size `(28, 28, 1)`,
scaled to [0, 1] outside the model, one-hot labels.
"""

import keras
from keras import layers

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/vision/mnist_convnet/"
NOTES = (
    "The example's model at its own size (28 x 28 x 1, 32 and 64 filters, 10 classes); "
    "trained 2 steps of 16 random images in [0, 1] with one-hot labels instead of 15 "
    "epochs of MNIST."
)

# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)


def training_data():
    """(x, y) of two batches: images in [0, 1], as the example scales MNIST, and one-hot labels."""
    data = synthetic.rng()
    x_train = data.uniform(0.0, 1.0, size=(32, *input_shape)).astype("float32")
    y_train = keras.utils.to_categorical(synthetic.labels(data, 32, num_classes), num_classes)
    return x_train, y_train


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
