"""The diffusion schedule and DDIM arithmetic in numpy float64 (no torch).

ᾱ_t near t = T is tiny (cosine: ~1e-9 at t = 999): the schedule and every DDIM update stay in
float64 here, and only the noisy spans handed to the denoiser graph are cast to float32. The
graphs therefore never hold schedule constants that an fp16 or fp32 cast could break.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from nerserve.ner.archs.diffusion.config import DiffusionConfig


def alphas_cumprod(schedule: str, timesteps: int) -> np.ndarray:
    """ᾱ_t for t = 0..T-1 (float64)."""
    if schedule == "cosine":  # Nichol & Dhariwal, s = 0.008, betas clipped to 0.999
        s = 0.008
        x = np.linspace(0, timesteps, timesteps + 1, dtype=np.float64)
        curve = np.cos(((x / timesteps) + s) / (1 + s) * math.pi * 0.5) ** 2
        curve = curve / curve[0]
        betas = np.clip(1 - (curve[1:] / curve[:-1]), 0, 0.999)
    elif schedule == "linear":  # 1e-4 → 0.02 for T = 1000, scaled by 1000 / T
        scale = 1000 / timesteps
        betas = np.linspace(scale * 1e-4, scale * 0.02, timesteps, dtype=np.float64)
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    return np.cumprod(1.0 - betas)


def step_pairs(timesteps: int, steps: int) -> list[tuple[int, int]]:
    """(t, t_next) of each DDIM step: `steps` evenly spaced times from T-1 down, ending at -1."""
    times = np.linspace(-1, timesteps - 1, steps + 1).astype(np.int64)[::-1].tolist()
    return list(itertools.pairwise(times))


def spans_to_noise(left: np.ndarray, right: np.ndarray, lengths: np.ndarray, scale: float) -> np.ndarray:
    """Word spans [left, right] (inclusive) → (left, width) in the noise space [-λ, λ]; [..., 2]."""
    last = np.maximum(lengths - 1, 1).astype(np.float64)
    unit = np.stack([left / last, (right - left) / last], axis=-1)
    return np.clip((unit * 2.0 - 1.0) * scale, -scale, scale)


class Sampler:
    """DDIM over the denoiser's predictions: x̂0 from the predicted boundaries, ε̂ from x̂0."""

    def __init__(self, config: DiffusionConfig) -> None:
        self.alphas = alphas_cumprod(config.schedule, config.timesteps)
        self.timesteps = config.timesteps
        self.scale = config.scale
        self.eta = config.eta

    def noisy(self, x0: np.ndarray, t: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """q(x_t | x_0) for training: x0 [B, K, 2], t [B], noise [B, K, 2]."""
        a = self.alphas[t][:, None, None]
        return np.sqrt(a) * x0 + np.sqrt(1.0 - a) * noise

    def step(self, x_t: np.ndarray, x0: np.ndarray, t: int, t_next: int, z: np.ndarray) -> np.ndarray:
        """One DDIM update x_t → x_{t_next} (float64)."""
        a, a_next = self.alphas[t], self.alphas[t_next]
        epsilon = (x_t * math.sqrt(1.0 / a) - x0) / math.sqrt(1.0 / a - 1.0)
        sigma = self.eta * math.sqrt((1 - a / a_next) * (1 - a_next) / (1 - a))
        c = math.sqrt(max(1.0 - a_next - sigma**2, 0.0))
        return x0 * math.sqrt(a_next) + c * epsilon + sigma * z
