"""cnn_image_classification (FunctionBench): a small convolutional network in numpy (conv 5×5 ×8,
ReLU, max-pool, conv 3×3 ×16, ReLU, max-pool, global mean/max pool, dense, softmax) classifies args["images"] generated
64 × 64 RGB pictures (default 64, at most 1024) into four texture classes. The weights are
`model.npz` beside this file, made deterministically by `make_model.py` (committed, 7 KB), so
nothing is downloaded. The pictures are generated with known labels (seed args["seed"]), so the
answer carries the network's accuracy as well as its predictions."""

import os
import time

import numpy as np

CLASSES = ("horizontal", "vertical", "diagonal", "checker")
SIZE = 64


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def synth(n: int, seed: int) -> tuple:
    """n pictures (n, 3, 64, 64) float32 in [0, 1] with labels 0..3 in turn: stripes of a random
    period, phase and two distinct random colours in the label's orientation (or a checkerboard), plus
    Gaussian noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    images = np.empty((n, 3, SIZE, SIZE), np.float32)
    labels = np.arange(n) % len(CLASSES)
    for i, c in enumerate(labels):
        period = rng.uniform(6.0, 16.0)
        phase = rng.uniform(0.0, 2 * np.pi)
        k = 2 * np.pi / period
        if c == 0:
            wave = np.sin(k * yy + phase)
        elif c == 1:
            wave = np.sin(k * xx + phase)
        elif c == 2:
            wave = np.sin(k * (xx + yy) / np.sqrt(2) + phase)
        else:
            wave = np.sin(k * xx + phase) * np.sin(k * yy + phase)
        mask = (wave > 0).astype(np.float32)
        a = rng.uniform(0, 1, 3)
        b = (a + rng.uniform(0.3, 0.7, 3)) % 1.0  # two colours that differ in every channel
        img = a[:, None, None] * mask + b[:, None, None] * (1 - mask)
        img += rng.normal(0, 0.1, img.shape)
        images[i] = np.clip(img, 0, 1)
    return images, labels


def conv_relu_pool(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Valid convolution (x: N,C,H,W; w: F,C,K,K) + bias, ReLU, then 2×2 max-pool."""
    k = w.shape[-1]
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))  # N,C,H',W',K,K
    y = np.einsum("nchwij,fcij->nfhw", win, w, optimize=True) + b[None, :, None, None]
    np.maximum(y, 0, out=y)
    n, f, h, wd = y.shape
    y = y[:, :, : h // 2 * 2, : wd // 2 * 2]
    return y.reshape(n, f, h // 2, 2, wd // 2, 2).max(axis=(3, 5))


def features(model, images: np.ndarray) -> np.ndarray:
    """Per-picture contrast normalization, the two conv blocks, then global mean and max pooling
    of each of the 16 maps (32 features: a texture's orientation, not its position)."""
    x = images - images.mean(axis=(1, 2, 3), keepdims=True)
    x /= x.std(axis=(1, 2, 3), keepdims=True) + 1e-3
    x = conv_relu_pool(x, model["conv1_w"], model["conv1_b"])
    x = conv_relu_pool(x, model["conv2_w"], model["conv2_b"])
    return np.concatenate([x.mean(axis=(2, 3)), x.max(axis=(2, 3))], axis=1)


def forward(model, images: np.ndarray) -> np.ndarray:
    """Class probabilities (N, 4)."""
    f = (features(model, images) - model["feat_mean"]) / model["feat_std"]
    z = f @ model["dense_w"] + model["dense_b"]
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def load_model(path: str) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


MODEL_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.npz")
MODEL = load_model(MODEL_PATH) if os.path.exists(MODEL_PATH) else None


def main(args: dict) -> dict:
    if MODEL is None:
        raise RuntimeError("model.npz is missing: run make_model.py")
    n = _int(args, "images", 64, 1, 1024)
    seed = _int(args, "seed", 1, 0, 2**32 - 1)
    images, labels = synth(n, seed)
    t0 = time.perf_counter()
    # In batches of 16: the convolutions' intermediate arrays stay near 20 MB.
    probs = np.concatenate([forward(MODEL, images[i : i + 16]) for i in range(0, n, 16)])
    pred = probs.argmax(axis=1)
    return {
        "images": n,
        "accuracy": round(float((pred == labels).mean()), 4),
        "first": {"class": CLASSES[int(pred[0])], "p": round(float(probs[0].max()), 4)},
        "predicted": {c: int((pred == i).sum()) for i, c in enumerate(CLASSES)},
        "latency_s": time.perf_counter() - t0,
    }
