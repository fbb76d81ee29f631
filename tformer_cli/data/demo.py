"""The embedded default dataset: sentiment sentences whose label depends on word order and negation scope.

Every sentence is built from a small grammar whose meaning rules decide the label, so the label is exact
(no noise) yet cannot be read off a bag of words:

- negation flips a clause ("the plot was not bad at all" -> pos), intensifiers do not ("really bad" -> neg);
- "never" flips "the film was never dull" but intensifies "I have never seen a film so dull";
- in "A but B" and "although A, B" / "B, although A" the main clause B decides;
- "X, not Y" and "not Y but X" assert X ("good, not great" -> pos; "bad, not good" -> neg);
- negation stops at the clause boundary ("I did not expect much, but the cast was awful" -> neg).

The same words in another order often carry the opposite label, which is what defeats bag-of-words models.
"""
from __future__ import annotations

import random

POSITIVE = ["good", "great", "excellent", "wonderful", "brilliant", "enjoyable", "fun", "charming", "superb",
            "moving", "clever", "delightful", "solid", "gripping", "beautiful", "fresh"]
NEGATIVE = ["bad", "awful", "terrible", "dull", "boring", "weak", "tedious", "clumsy", "bland", "painful",
            "dreadful", "messy", "lifeless", "predictable", "forgettable", "poor"]
SUBJECTS = ["the movie", "the film", "the plot", "the acting", "the script", "the ending", "the soundtrack",
            "the cast", "the dialogue", "the pacing", "the story", "the direction", "the camera work",
            "the lead", "the second half", "the finale", "this sequel", "the premise"]
VERBS = ["was", "is", "felt", "seemed", "looked", "turned out"]
INTENSIFIERS = ["very", "really", "truly", "extremely", "quite", "incredibly", "so", "rather"]
OPENERS = ["", "", "", "honestly, ", "overall, ", "to be fair, ", "in the end, ", "frankly, ", "i think "]
ENDINGS = ["", "", ".", ".", "!", "..."]
NEUTRAL_LEADS = ["i did not expect much", "i was not sure at first", "nobody warned me",
                 "i had not read the reviews", "i never planned to watch it"]

LABELS = ["negative", "positive"]


def _adjective(rng: random.Random, polarity: int) -> str:
    return rng.choice(POSITIVE if polarity > 0 else NEGATIVE)


def _clause(rng: random.Random, polarity: int) -> str:
    """A clause 'SUBJ VERB ...' whose meaning has the given polarity (+1 / -1)."""
    subj, verb = rng.choice(SUBJECTS), rng.choice(VERBS)
    kind = rng.randrange(6)
    if kind <= 1:  # plain, optionally intensified
        intens = rng.choice(INTENSIFIERS) + " " if rng.random() < 0.5 else ""
        return f"{subj} {verb} {intens}{_adjective(rng, polarity)}"
    adj = _adjective(rng, -polarity)  # the negated forms say the opposite of their adjective
    if kind == 2:
        intens = rng.choice(INTENSIFIERS) + " " if rng.random() < 0.4 else ""
        return f"{subj} {verb} not {intens}{adj}"
    if kind == 3:
        return f"{subj} {verb} not {adj} at all"
    if kind == 4:
        return f"{subj} was never {adj}"
    return f"{subj} was hardly {adj}"


def _sentence(rng: random.Random, label: int) -> str:
    pol = 1 if label == 1 else -1
    other = rng.choice([1, -1])
    kind = rng.randrange(9)
    if kind == 0:
        body = _clause(rng, pol)
    elif kind == 1:
        body = f"{_clause(rng, other)} but {_clause(rng, pol)}"
    elif kind == 2:
        body = f"although {_clause(rng, other)}, {_clause(rng, pol)}"
    elif kind == 3:
        body = f"{_clause(rng, pol)}, although {_clause(rng, other)}"
    elif kind == 4:
        body = f"{rng.choice(SUBJECTS)} was {_adjective(rng, pol)}, not {_adjective(rng, other)}"
    elif kind == 5:
        body = f"{rng.choice(SUBJECTS)} was not {_adjective(rng, other)} but {_adjective(rng, pol)}"
    elif kind == 6:
        noun = rng.choice(["a film", "a movie", "a story", "a cast", "an ending"])
        body = f"i have never seen {noun} so {_adjective(rng, pol)}"
    elif kind == 7:
        body = f"i did not think {rng.choice(SUBJECTS)} was {_adjective(rng, -pol)}"
    else:
        body = f"{rng.choice(NEUTRAL_LEADS)}, but {_clause(rng, pol)}"
    return rng.choice(OPENERS) + body + rng.choice(ENDINGS)


def generate(n: int = 6000, seed: int = 0) -> tuple[list[str], list[int]]:
    """n distinct sentences, half of each label, in shuffled order; deterministic from seed."""
    rng = random.Random(seed)
    seen: set[str] = set()
    texts, labels = [], []
    while len(texts) < n:
        label = len(texts) % 2
        text = _sentence(rng, label)
        if text in seen:
            continue
        seen.add(text)
        texts.append(text)
        labels.append(label)
    order = list(range(n))
    rng.shuffle(order)
    return [texts[i] for i in order], [labels[i] for i in order]


def splits(n_train: int = 8000, n_validation: int = 1000, n_test: int = 1000, seed: int = 0) -> dict:
    """{'train': (texts, labels), 'validation': ..., 'test': ...} with no sentence in two splits."""
    texts, labels = generate(n_train + n_validation + n_test, seed)
    a, b = n_train, n_train + n_validation
    return {"train": (texts[:a], labels[:a]), "validation": (texts[a:b], labels[a:b]),
            "test": (texts[b:], labels[b:])}
