"""`SinusoidalPositionEncoding`: the fixed sin/cos encoding, exact in float32."""

import math

import keras
import numpy as np
from keras import ops

LAYOUTS = ("interleave", "concat")
SPACINGS = ("paper", "tensor2tensor")

# Positions are split as p = 2048 * p_hi + p_lo and each frequency (in cycles
# per position) into 11-bit digits, so every digit product has at most 24
# significant bits and is exact in float32 (see `_cycles`).
_DIGIT_BITS = 11
_RADIX = float(2**_DIGIT_BITS)
_TWO_PI = 2.0 * math.pi


def channel_frequencies(depth, max_wavelength, layout, spacing):
    """Angular frequency and phase of every channel, in float64 NumPy.

    Channel `c` of the encoding at position `p` is `sin(p * omega[c] +
    phase[c])`, with phase 0 for a sine channel and pi/2 for a cosine channel.
    A zero-padding channel (the last one of an odd `depth` in the "concat"
    layout) has omega = phase = 0, so it is exactly `sin(0) = 0`.

    Args:
        depth: the number of channels.
        max_wavelength: the longest wavelength (10000 in the paper).
        layout: `"interleave"` or `"concat"`.
        spacing: `"paper"` or `"tensor2tensor"` (how the frequencies are spaced).

    Returns:
        `(omega, phase)`, each a float64 array of shape `(depth,)`.
    """
    pairs = (depth + 1) // 2 if layout == "interleave" else depth // 2
    k = np.arange(pairs, dtype=np.float64)
    if spacing == "paper":
        freqs = max_wavelength ** (-2.0 * k / depth)
    else:
        freqs = np.exp(-k * math.log(max_wavelength) / max(pairs - 1, 1))
    channel = np.arange(depth)
    if layout == "interleave":
        omega = freqs[channel // 2]
        phase = np.where(channel % 2 == 1, math.pi / 2, 0.0)
    else:
        is_sin, is_cos = channel < pairs, (channel >= pairs) & (channel < 2 * pairs)
        omega = np.zeros(depth)
        omega[is_sin] = freqs[channel[is_sin]]
        omega[is_cos] = freqs[channel[is_cos] - pairs]
        phase = np.where(is_cos, math.pi / 2, 0.0)
    return omega, phase


def _digit_tables(omega, phase):
    """Split each channel's frequency into float32 pieces for `_cycles`.

    With `f = omega / 2pi` in cycles per position (f < 1/(2pi) < 1/4), written in
    fixed point as `f = m1*2^-11 + m2*2^-22 + m3*2^-33 + ...`:

    * `p_lo * f = p_lo*m1*2^-11 + p_lo*m2*2^-22 + p_lo*rest_lo`
    * `2048 * p_hi * f = p_hi*m1 + p_hi*m2*2^-11 + p_hi*m3*2^-22 + p_hi*rest_hi`

    `p_hi*m1` is a whole number of cycles and is dropped; the four middle
    products are exact; the two `rest` products are below 2^-9 cycles and are
    rounded harmlessly.
    """
    cycles = omega / _TWO_PI
    fixed = np.rint(cycles * 2.0 ** (4 * _DIGIT_BITS)).astype(np.int64)
    mask = int(_RADIX) - 1
    m1 = (fixed >> (3 * _DIGIT_BITS)) & mask
    m2 = (fixed >> (2 * _DIGIT_BITS)) & mask
    m3 = (fixed >> _DIGIT_BITS) & mask
    unit, unit2 = 2.0**-_DIGIT_BITS, 2.0 ** (-2 * _DIGIT_BITS)
    rest_lo = cycles - m1 * unit - m2 * unit2
    rest_hi = cycles * _RADIX - m1 - m2 * unit - m3 * unit2
    exact_lo = np.stack([m1 * unit, m2 * unit2])
    exact_hi = np.stack([m2 * unit, m3 * unit2])
    return {
        "exact_lo": exact_lo.astype(np.float32),
        "exact_hi": exact_hi.astype(np.float32),
        "rest_lo": rest_lo.astype(np.float32),
        "rest_hi": rest_hi.astype(np.float32),
        "phase": (phase / _TWO_PI).astype(np.float32),  # 0 or exactly 1/4
        "cycles64": cycles,
        "phase64": phase / _TWO_PI,
    }


def _centered_fraction(x):
    """`x` minus its nearest integer: exact in floating point."""
    return ops.subtract(x, ops.round(x))


@keras.saving.register_keras_serializable(package="keras_layers")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Adds the fixed sinusoidal position encoding to a sequence of vectors.

    For inputs of shape `(batch, sequence, d)` it returns `inputs + P`, where
    `P[p, c] = sin(p * omega_c)` on sine channels and `cos(p * omega_c)` on
    cosine channels. It has no weights and no maximum length.

    Exact at any length and dtype. The angle `p * omega` grows with the position;
    computed naively in float32 it carries an error of about `p * 6e-8` radians,
    which is 2.5e-4 by position 4096 and 1e-3 by position 16384, and in bfloat16
    positions 300 and 301 get the same encoding. Here the angle is reduced modulo
    one turn with float32 operations that are all exact (the position and the
    frequency are split into digits whose products fit in 24 bits), so the
    float32 encoding stays within 1e-6 of the float64 formula for every position
    below 2**24. Under `mixed_float16` or `mixed_bfloat16` the sum `inputs + P` is
    formed in float32 and rounded once to the compute dtype. With a float64
    compute dtype the encoding is computed in float64.

    Layouts and spacings (all reproduced to float32 rounding):

    | `layout`, `spacing` | matches |
    |---|---|
    | `"interleave"`, `"paper"` | the paper; keras-hub `SinePositionEncoding` |
    | `"concat"`, `"paper"` | TensorFlow's Transformer tutorial |
    | `"concat"`, `"tensor2tensor"` | tensor2tensor `get_timing_signal_1d`; |
    | | fairseq (positions from 0) |

    `"interleave"` puts sine on even channels and cosine on odd ones; `"concat"`
    puts all sines first, then all cosines. `"paper"` spacing uses frequencies
    `max_wavelength ** (-2k / d)`, `"tensor2tensor"` uses
    `exp(-k * ln(max_wavelength) / (n - 1))` for `n` frequencies, so its lowest
    frequency is exactly `1 / max_wavelength`. With an odd `d`, `"interleave"`
    ends with one more sine channel (as keras-hub does) and `"concat"` ends with a
    zero channel (as tensor2tensor and fairseq do).

    Masks pass through unchanged.

    Args:
        max_wavelength: Positive number, the longest wavelength (10000 in the
            paper).
        layout: `"interleave"` (default) or `"concat"`.
        spacing: `"paper"` (default) or `"tensor2tensor"`.
        **kwargs: Base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: Float tensor of shape `(batch, sequence, d)`.
        start_index: Integer (Python int or scalar integer tensor) added to every
            position, for cached decoding. Defaults to 0.
        positions: Optional integer tensor of shape `(sequence,)` or
            `(batch, sequence)` giving each token's position explicitly (for
            example to skip left padding). Overrides `start_index`.

    Example:

    >>> import numpy as np
    >>> layer = SinusoidalPositionEncoding()
    >>> out = layer(np.zeros((1, 3, 4), "float32"))
    >>> np.round(np.asarray(out, "float64")[0], 3).tolist()[1]
    [0.841, 0.54, 0.01, 1.0]

    References:
        - Vaswani et al., "Attention Is All You Need", 2017, section 3.5:
          PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos /
          10000^(2i/d)).
    """

    def __init__(
        self,
        max_wavelength=10000.0,
        layout="interleave",
        spacing="paper",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if (
            isinstance(max_wavelength, bool)
            or not isinstance(max_wavelength, int | float)
            or not math.isfinite(max_wavelength)
            or max_wavelength <= 0
        ):
            raise ValueError(
                "`max_wavelength` must be a positive finite number. "
                f"Received: max_wavelength={max_wavelength!r}"
            )
        if layout not in LAYOUTS:
            raise ValueError(f"`layout` must be one of {LAYOUTS}. Received: layout={layout!r}")
        if spacing not in SPACINGS:
            raise ValueError(f"`spacing` must be one of {SPACINGS}. Received: spacing={spacing!r}")
        self.max_wavelength = max_wavelength
        self.layout = layout
        self.spacing = spacing
        self.supports_masking = True
        self._tables = None

    def build(self, input_shape):
        depth = input_shape[-1]
        if depth is None:
            raise ValueError(
                "SinusoidalPositionEncoding needs a known last dimension (the "
                f"model width). Received input shape {input_shape}."
            )
        self._tables = _digit_tables(
            *channel_frequencies(depth, float(self.max_wavelength), self.layout, self.spacing)
        )

    def _cycles(self, positions):
        """Angle of every (position, channel) in turns, reduced to [-1/2, 1/2]."""
        t = self._tables
        positions = ops.cast(positions, "float32")
        p_hi = ops.floor(positions / _RADIX)
        p_lo = positions - _RADIX * p_hi
        p_hi = ops.expand_dims(p_hi, -1)
        p_lo = ops.expand_dims(p_lo, -1)
        # Every product below is exact and lies on the 2^-22 grid; the sum of
        # four centred fractions and a phase of 0 or 1/4 stays below 4, so it
        # is exact too. Only the final addition of the small `rest` terms
        # rounds, once.
        whole = (
            _centered_fraction(p_lo * t["exact_lo"][0])
            + _centered_fraction(p_lo * t["exact_lo"][1])
            + _centered_fraction(p_hi * t["exact_hi"][0])
            + _centered_fraction(p_hi * t["exact_hi"][1])
            + t["phase"]
        )
        rest = p_lo * t["rest_lo"] + p_hi * t["rest_hi"]
        return _centered_fraction(whole) + rest

    def _cycles_float64(self, positions):
        t = self._tables
        turns = ops.expand_dims(ops.cast(positions, "float64"), -1) * t["cycles64"]
        return _centered_fraction(turns) + t["phase64"]

    def _float64(self) -> bool:
        """Whether this backend really computes in float64 for this layer (JAX
        without `JAX_ENABLE_X64` silently uses float32)."""
        if self.compute_dtype != "float64":
            return False
        probe = ops.convert_to_tensor(np.zeros((), "float64"))
        return keras.backend.standardize_dtype(probe.dtype) == "float64"

    def call(self, inputs, start_index=0, positions=None):
        if positions is None:
            length = ops.shape(inputs)[-2]
            positions = ops.arange(length, dtype="int32") + ops.cast(start_index, "int32")
        if self._float64():
            cycles = self._cycles_float64(positions)
            return inputs + ops.sin(cycles * _TWO_PI)
        encoding = ops.sin(self._cycles(positions) * _TWO_PI)
        # Form the sum in float32 and round it once to the compute dtype.
        total = ops.cast(inputs, "float32") + encoding
        return ops.cast(total, inputs.dtype)

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "layout": self.layout,
                "spacing": self.spacing,
            }
        )
        return config
