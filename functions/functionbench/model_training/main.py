"""model_training (FunctionBench): trains a review-sentiment classifier with scikit-learn, tf-idf
features and logistic regression, on args["docs"] generated reviews (default 5000, at most
20000; nothing is downloaded), holds a quarter out to measure accuracy, and pickles the model
into /tmp as FunctionBench stores it (the file is removed). Returns the accuracy, the vocabulary
size and the model's size."""

import os
import pickle
import random
import tempfile
import time

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

POSITIVE = "great tasty fresh delicious love perfect excellent recommend favorite yummy".split()
NEGATIVE = "stale bland awful broken refund disappointed terrible worst soggy expired".split()
NEUTRAL = (
    "the a this product box bag coffee tea snack flavor price package shipping ordered "
    "amazon brand taste bought store cookies chips sauce chocolate dog food"
).split()


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def reviews(n: int, seed: int) -> tuple:
    """n short reviews, half positive: mostly neutral words, a few of the label's sentiment words
    and, in one review of five, a word of the other sentiment (noise the model must weigh)."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        label = i % 2
        own, other = (POSITIVE, NEGATIVE) if label else (NEGATIVE, POSITIVE)
        words = [rng.choice(NEUTRAL) for _ in range(rng.randint(8, 20))]
        words += [rng.choice(own) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.2:
            words.append(rng.choice(other))
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def main(args: dict) -> dict:
    n = _int(args, "docs", 5000, 8, 20000)
    seed = _int(args, "seed", 32, 0, 2**32 - 1)
    texts, labels = reviews(n, seed)
    cut = n * 3 // 4
    t0 = time.perf_counter()
    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    x_train = vec.fit_transform(texts[:cut])
    model = LogisticRegression(max_iter=200)
    model.fit(x_train, labels[:cut])
    accuracy = float(model.score(vec.transform(texts[cut:]), labels[cut:]))
    fd, path = tempfile.mkstemp(prefix="hearth-fb-model-", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump((vec, model), f)
        model_bytes = os.path.getsize(path)
    finally:
        os.unlink(path)
    return {
        "docs": n,
        "accuracy": round(accuracy, 4),
        "features": len(vec.vocabulary_),
        "model_bytes": model_bytes,
        "latency_s": time.perf_counter() - t0,
    }
