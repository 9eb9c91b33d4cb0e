"""Makes model.npz for main.py, deterministically: the first convolution layer is a fixed bank of
oriented (Gabor) filters, the second keeps seeded random weights (a random-feature network), and
the dense layer is fitted by softmax regression (full-batch gradient descent) on 2000 generated
pictures. Run with the runtime's python and numpy from the wheelhouse:
    python3 make_model.py [OUT]        (default: model.npz beside this file)"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import main  # noqa: E402


def gabor_bank() -> np.ndarray:
    """8 oriented 5×5 filters (4 orientations × even/odd phase), the same on every colour
    channel: what a CNN's first layer learns on natural images, without training it here."""
    yy, xx = np.mgrid[-2:3, -2:3].astype(np.float64)
    bank = []
    for theta in np.arange(4) * np.pi / 4:
        u = xx * np.cos(theta) + yy * np.sin(theta)
        env = np.exp(-(xx**2 + yy**2) / 8.0)
        for phase in (np.cos, np.sin):
            g = env * phase(2 * np.pi * u / 5.0)
            g -= g.mean()
            g /= np.abs(g).sum()
            bank.append(np.repeat(g[None], 3, axis=0) / 3)
    return np.asarray(bank, np.float32)


def make() -> dict:
    rng = np.random.default_rng(20260328)
    m = {
        "conv1_w": gabor_bank(),
        "conv1_b": np.zeros(8, np.float32),
        "conv2_w": (rng.normal(0, 1, (16, 8, 3, 3)) * np.sqrt(2 / 72)).astype(np.float32),
        "conv2_b": np.zeros(16, np.float32),
    }
    images, labels = main.synth(2000, seed=7)
    f = np.concatenate([main.features(m, images[i : i + 100]) for i in range(0, 2000, 100)])
    f = f.astype(np.float64)
    mean, std = f.mean(axis=0), f.std(axis=0) + 1e-3
    z = (f - mean) / std
    y = np.eye(len(main.CLASSES))[labels]
    # Softmax regression, full-batch gradient descent from zero: deterministic, no framework.
    w, b = np.zeros((z.shape[1], len(main.CLASSES))), np.zeros(len(main.CLASSES))
    for _ in range(2000):
        logits = z @ w + b
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - y) / len(z)
        w -= 0.5 * (z.T @ g + 1e-3 * w)
        b -= 0.5 * g.sum(axis=0)
    m["feat_mean"] = mean.astype(np.float32)
    m["feat_std"] = std.astype(np.float32)
    m["dense_w"] = w.astype(np.float32)
    m["dense_b"] = b.astype(np.float32)
    return m


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else main.MODEL_PATH
    np.savez_compressed(out, **make())
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
