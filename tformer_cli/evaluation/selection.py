"""Which unlabelled texts to label next: the uncertain ones, spread over what the model sees as different texts.

Uncertainty alone picks well one text at a time, but a batch of the N most uncertain texts is often N versions of
the same confusing case (one review posted twice, one template with a name swapped): labelling the fifth of them
teaches the model little the first did not. Diversity alone (k-center greedy on the encoder's features, Sener &
Savarese 2018) covers the data but spends labels on texts the model already gets right. So the two are combined
in two steps, as in Ash et al. 2020's and Citovsky et al. 2021's batch methods:

    1. candidates: the `pool_factor * N` most uncertain eligible texts (exact duplicates, empty texts and texts
       already in the labelled data are never eligible);
    2. k-center greedy over the candidates' L2-normalised pooled features, seeded by the labelled texts' features:
       each pick is the candidate farthest from everything labelled or picked so far, that distance weighted by
       its uncertainty, so a far but nearly certain outlier does not beat a near-as-far, much less certain text.

Uncertainty is a number in [0, 1], 1 the least sure:
    margin   1 - (p1 - p2): the gap between the two most probable classes (what one label most likely settles);
    entropy  H(p) / log C: spread over all classes (with many classes, confusion among several of them counts).
A multi-label model decides each label on its own, at that label's threshold t: its uncertainty is how close a
probability is to t, as a fraction of the room on that side (|p - t| / t below it, / (1 - t) above it). margin
takes the label closest to flipping; entropy the mean closeness over all labels.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError

UNCERTAINTY = ("margin", "entropy")


def uncertainty(probs: np.ndarray, method: str = "margin", thresholds=None) -> np.ndarray:
    """(n, C) probabilities -> (n,) scores in [0, 1], higher is less sure. thresholds (C,): a multi-label model's
    per-label thresholds (its probabilities are independent per label, not one distribution). NaN rows (empty
    texts) stay NaN."""
    if method not in UNCERTAINTY:
        raise ConfigError(f"uncertainty={method!r} is not one of {', '.join(UNCERTAINTY)}")
    p = np.asarray(probs, dtype=np.float64)  # (n, C)
    if p.ndim != 2 or p.shape[1] < 1:
        raise ConfigError(f"probabilities must be a (texts, classes) matrix, not shape {p.shape}")
    if thresholds is not None:
        t = np.asarray(thresholds, dtype=np.float64)[None, :]  # (1, C)
        room = np.where(p >= t, 1.0 - t, t)  # how far a probability can be from t on its side
        closeness = 1.0 - np.abs(p - t) / np.maximum(room, 1e-12)  # (n, C): 1 at the threshold, 0 at 0 or 1
        return np.clip(closeness.max(1) if method == "margin" else closeness.mean(1), 0.0, 1.0)
    if method == "margin":
        if p.shape[1] < 2:
            return np.zeros(len(p))
        top2 = -np.sort(-p, axis=1)[:, :2]  # (n, 2): the two largest probabilities
        return np.clip(1.0 - (top2[:, 0] - top2[:, 1]), 0.0, 1.0)
    terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)  # (n, C): 0 log 0 = 0
    return np.clip(terms.sum(1) / np.log(max(p.shape[1], 2)), 0.0, 1.0)


def eligible(texts: list[str], labelled=(), visible=None) -> np.ndarray:
    """Indices of the texts worth a label: the first of each exact duplicate (after trimming the ends' spaces),
    none that is empty (visible: a test of 'has a character', default: any non-space) and none already labelled."""
    visible = visible or (lambda t: bool(t.strip()))
    seen = {t.strip() for t in labelled}
    keep = []
    for i, text in enumerate(texts):
        key = text.strip()
        if key in seen or not visible(text):
            continue
        seen.add(key)
        keep.append(i)
    return np.asarray(keep, dtype=np.int64)


def normalised(features: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length: distances then compare directions (what the texts are about), not the norms
    that grow with a text's length or its tokens' rarity."""
    f = np.asarray(features, dtype=np.float64)
    return f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)


def k_center_greedy(features: np.ndarray, k: int, seeds: np.ndarray | None = None,
                    weights: np.ndarray | None = None) -> list[int]:
    """k row indices of `features` (m, d), each the row farthest from the seeds (s, d) and the rows already
    picked (times its weight, when given), so that the picks cover the rows instead of crowding one region. With
    no seeds the first pick is the heaviest row (the first row when unweighted). Rows at distance 0 from a pick
    (copies in feature space) are taken only once every other row is."""
    m = len(features)
    k = min(k, m)
    if k <= 0:
        return []
    f = normalised(features)  # (m, d)
    w = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64) + 1e-6  # (+: weight 0 still picks)
    if seeds is not None and len(seeds):
        s = normalised(seeds)  # (s, d)
        # squared distance of unit vectors: 2 - 2 cos; the nearest seed of each row, in blocks of seeds
        nearest = np.full(m, np.inf)
        for start in range(0, len(s), 4096):
            cos = f @ s[start:start + 4096].T  # (m, block)
            nearest = np.minimum(nearest, np.maximum(2.0 - 2.0 * cos.max(1), 0.0))
        first = int(np.argmax(nearest * w))
    else:
        nearest = np.full(m, np.inf)
        first = int(np.argmax(w))
    picks = [first]
    taken = np.zeros(m, dtype=bool)
    taken[first] = True
    for _ in range(k - 1):
        last = f[picks[-1]]  # (d,)
        nearest = np.minimum(nearest, np.maximum(2.0 - 2.0 * (f @ last), 0.0))  # (m,)
        score = np.where(taken, -1.0, nearest * w)
        nxt = int(np.argmax(score))
        picks.append(nxt)
        taken[nxt] = True
    return picks


def candidates(scores: np.ndarray, pool: int, among: np.ndarray | None = None) -> np.ndarray:
    """The `pool` most uncertain of the rows `among` (default: all), most uncertain first (ties: input order)."""
    among = np.arange(len(scores)) if among is None else np.asarray(among, dtype=np.int64)
    order = np.argsort(-np.asarray(scores)[among], kind="stable")
    return among[order[:pool]]


def select(probs: np.ndarray, n: int, *, features=None, labelled_features=None, method: str = "margin",
           thresholds=None, pool_factor: int = 10, among: np.ndarray | None = None) -> np.ndarray:
    """Indices of the n rows of `probs` (n_texts, C) to label next, in pick order.

    features: (n_texts, d) pooled features of every row, or a function of an index array returning the features
    of those rows only (a model runs on the candidates alone, not the whole pool); None: uncertainty only.
    labelled_features (s, d): the labelled texts', so the picks also keep away from what is labelled.
    among: the eligible rows (`eligible`); default every row. pool_factor: candidates per pick (1: uncertainty
    only, large: diversity weighs more)."""
    return select_scored(uncertainty(probs, method, thresholds), n, features=features,
                         labelled_features=labelled_features, pool_factor=pool_factor, among=among)


def select_scored(scores: np.ndarray, n: int, *, features=None, labelled_features=None, pool_factor: int = 10,
                  among: np.ndarray | None = None) -> np.ndarray:
    """`select` from each row's uncertainty (n_texts,) alone: a pool scored a chunk at a time keeps one number
    per text, not one per (text, class)."""
    scores = np.asarray(scores)
    rows = np.arange(len(scores)) if among is None else np.asarray(among, dtype=np.int64)
    rows = rows[np.isfinite(scores[rows])]
    if n > len(rows):
        raise ConfigError(f"n={n} is more than the {len(rows)} texts that can be suggested")
    pool = candidates(scores, max(n, n * pool_factor), rows)
    if features is None or len(pool) == n:
        return pool[:n]
    feats = features(pool) if callable(features) else np.asarray(features)[pool]  # (pool, d)
    picks = k_center_greedy(feats, n, labelled_features, weights=scores[pool])
    return pool[picks]
