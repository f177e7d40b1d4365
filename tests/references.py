"""Independent NumPy references, written from each paper or code base's formula.

They use float64 and share no code with `keras_layers`.
"""

import math

import numpy as np


def paper_encoding(length, depth, max_wavelength=10000.0, start=0):
    """Vaswani et al. 3.5: PE(p, 2i) = sin(p / w^(2i/d)), PE(p, 2i+1) = cos(...)."""
    p = np.arange(start, start + length, dtype=np.float64)[:, None]
    i = np.arange(depth)[None, :]
    angle = p / max_wavelength ** (2 * (i // 2) / depth)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle))


def tf_tutorial_encoding(length, depth, max_wavelength=10000.0):
    """TensorFlow's Transformer tutorial: [sin | cos], rates 1/w^(i/(d/2))."""
    half = depth / 2
    positions = np.arange(length)[:, np.newaxis]
    depths = np.arange(half)[np.newaxis, :] / half
    angle_rads = positions * (1 / (max_wavelength**depths))
    return np.concatenate([np.sin(angle_rads), np.cos(angle_rads)], axis=-1)


def tensor2tensor_encoding(length, channels, max_timescale=1.0e4, start_index=0):
    """tensor2tensor `get_timing_signal_1d` (min_timescale 1), in NumPy."""
    position = np.arange(length, dtype=np.float64) + start_index
    num_timescales = channels // 2
    log_increment = math.log(float(max_timescale)) / max(num_timescales - 1, 1)
    inv_timescales = np.exp(np.arange(num_timescales) * -log_increment)
    scaled_time = position[:, None] * inv_timescales[None, :]
    signal = np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1)
    return np.pad(signal, [[0, 0], [0, channels % 2]])


def fairseq_encoding(num_embeddings, embedding_dim):
    """fairseq `SinusoidalPositionalEmbedding.get_embedding`, positions from 0."""
    half_dim = embedding_dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = np.exp(np.arange(half_dim, dtype=np.float64) * -emb)
    emb = np.arange(num_embeddings, dtype=np.float64)[:, None] * emb[None, :]
    emb = np.concatenate([np.sin(emb), np.cos(emb)], axis=1)
    if embedding_dim % 2 == 1:
        emb = np.concatenate([emb, np.zeros((num_embeddings, 1))], axis=1)
    return emb


def tied_logits(hidden, matrix, bias=None, scale=None, soft_cap=None):
    """Press & Wolf: logits = h E^T (+ b), then the optional scale and soft cap."""
    logits = np.asarray(hidden, np.float64) @ np.asarray(matrix, np.float64).T
    if bias is not None:
        logits = logits + bias
    if scale is not None:
        logits = logits * scale
    if soft_cap is not None:
        logits = soft_cap * np.tanh(logits / soft_cap)
    return logits
