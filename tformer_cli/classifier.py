"""A trained checkpoint as a Python object: what `tformer predict` runs, for notebooks and programs.

    from tformer_cli import Classifier
    clf = Classifier.load("outputs/train/2026-11-22/10-00-00-000000")   # a run dir or a checkpoint dir
    clf.predict(["a gripping, beautifully shot film"], top_k=2)
    clf.predict_proba(["..."])          # (n, classes) numpy array, columns in clf.labels order
    clf.predict_proba(["..."], calibrated=False)   # the model's raw probabilities (clf.calibrated = False: always)

Imports only torch, safetensors and tokenizers (no Hydra, datasets, scikit-learn or transformers), like the CLI's
`predict`; `OnnxClassifier` (deploy/onnx_classifier.py) answers the same calls from an exported model without torch. Every text gets an answer in input order; a text with no visible character (empty, spaces, zero-width
or combining characters only: data/visible.has_visible, the rule training drops such texts by) is marked
`"empty": True` (and a row of NaN in `predict_proba`) rather than given a confident label it has no grounds for.

Probabilities are calibrated: the logits divided by the temperature fitted on validation after training
(evaluation/calibration.py, saved in the checkpoint's meta.json; a checkpoint without one is read at T = 1).
A temperature never changes which label wins, so `calibrated=False` changes the numbers, never the answers.
"""
from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from pathlib import Path

from . import cores
from .data.visible import has_visible
from .errors import ArgumentTypeError, ConfigError, TformerError
from .safe_text import valid_unicode


MAX_BATCH = 1 << 20  # texts in one forward pass: past this a batch size is a typo (1e20), as in trainer.batch_size


def whole_number(value, name: str, low: int = 1, high: int | None = None) -> int:
    """A caller's count (top_k, batch_size): an int in [low, high]. 1.5, "2" and True are refused, not rounded or
    read as 1; a batch size past MAX_BATCH would overflow torch's index arithmetic, so it is refused here."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # (np.int64 is one; np.bool_ is not)
        raise ArgumentTypeError(f"{name}={value!r} must be a whole number (an int), not {type(value).__name__}")
    value = int(value)
    if value < low:
        raise ConfigError(f"{name}={value} must be at least {low}")
    if high is not None and value > high:
        raise ConfigError(f"{name}={value} must be at most {high}")
    return value


class TextPredictor:
    """Texts in, answers out, whatever runs the model: checks the texts, reads them as the checkpoint was trained
    to (windows for long_text=chunks), marks blank ones, and turns class probabilities into answers. A runtime
    (`Classifier`: torch; `OnnxClassifier`: onnxruntime) supplies `labels`, `path`, `_document_logits` and
    `temperature`."""

    runtime = "?"
    _tok = _long_text = None
    _max_len = 0
    multi_label = False  # then each text gets the set of labels whose probability reaches its threshold
    thresholds: list[float] | None = None  # (on the calibrated scale: the same cuts on the logits as raw)
    temperature: float | list[float] | None = None  # the checkpoint's (None: T = 1)
    calibrated = True  # False: predict and predict_proba give the raw model's probabilities unless asked otherwise
    conformal: dict | None = None  # the checkpoint's label-set cuts (evaluation/conformal.py; None: none saved)

    @property
    def labels(self) -> list[str]:
        raise NotImplementedError

    def _document_logits(self, windows, batch_size: int):
        """(texts, classes) numpy logits of `encode_batch`'s windows (a text's windows averaged)."""
        raise NotImplementedError

    def _probabilities(self, windows, batch_size: int, calibrated: bool | None = None):
        """(texts, classes) float32 numpy probabilities of `encode_batch`'s windows, calibrated unless
        calibrated=False (None: `self.calibrated`)."""
        return self._scaled(self._document_logits(windows, batch_size), calibrated)

    def _scaled(self, logits, calibrated: bool | None):
        from .evaluation.calibration import probabilities  # (numpy only)

        use = self._calibrated(calibrated)
        return probabilities(logits, self.temperature if use else None, self.multi_label)

    def _calibrated(self, calibrated: bool | None) -> bool:
        use = self.calibrated if calibrated is None else calibrated
        if not isinstance(use, bool):
            raise ArgumentTypeError(f"calibrated={use!r:.80} must be True or False")
        return use

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, labels={self.labels})"

    def _encode(self, texts):
        from .data.tokenization import encode_batch

        texts = given_texts(texts)
        filled = [i for i, t in enumerate(texts) if has_visible(t)]
        # a lone surrogate (an undecodable byte kept by surrogateescape) is U+FFFD: tokenizers cannot encode one
        windows = encode_batch(self._tok, [valid_unicode(texts[i]) for i in filled], self._max_len,
                               self._long_text)  # one window per text unless long_text=chunks
        return texts, filled, windows

    def _checked(self, probs):
        import numpy as np

        if not bool(np.isfinite(probs).all()):
            raise TformerError(f"checkpoint {self.path} gives non-finite probabilities (NaN or inf): its weights "
                               f"are corrupt; retrain or use another checkpoint")
        return probs

    def predict_proba(self, texts, *, batch_size: int = 64, calibrated: bool | None = None):
        """(len(texts), len(labels)) class probabilities (multi-label: each label's own); empty texts get NaN.
        Calibrated (the checkpoint's temperature) unless calibrated=False (None: `self.calibrated`)."""
        import numpy as np

        batch_size = whole_number(batch_size, "batch_size", high=MAX_BATCH)
        self._calibrated(calibrated)
        texts, filled, windows = self._encode(texts)
        out = np.full((len(texts), len(self.labels)), np.nan, dtype=np.float32)
        if filled:
            out[filled] = self._checked(self._probabilities(windows, batch_size, calibrated))
        return out

    def label_set_cut(self, coverage) -> tuple[float, float | None]:
        """(the level, the checkpoint's conformal cut there; None: every label) for predict's `coverage`, or one
        TformerError line: a level off the grid, or a checkpoint without cuts (serve answers that with a 400)."""
        from .evaluation import conformal  # (numpy only)

        level = conformal.level(coverage)
        if self.conformal is None:
            raise TformerError(f"{self.path} has no label-set cuts (trained with trainer.calibrate=false, or by an "
                               f"older tformer); {self._cuts_fix()}, or predict without coverage")
        return level, self.conformal["cuts"].get(conformal.key(level))

    def _cuts_fix(self) -> str:
        """How this model gets label-set cuts (an ONNX export reads them from its checkpoint: exported again)."""
        return (f"fit them without training again (tformer calibrate checkpoint={self.path} split=validation, or "
                f"file=<labelled texts>)")

    def predict(self, texts, *, top_k: int = 1, explain: bool = False, batch_size: int = 64,
                calibrated: bool | None = None, coverage: float | None = None) -> list[dict]:
        """One dict per text, in order: text, label, probability, top_k (the k best labels), explanation (if
        asked: explain=True or "occlusion" gives each word's weight, the fall in the answer's probability when it is
        deleted; explain="rollout" gives tokens with last-layer attention and rollout weights summing to 1), or
        empty=True for a blank text. A multi-label model answers labels (the set over the thresholds, most
        probable first) and probabilities ({label: p} of that set) instead of label and probability.
        calibrated=False (None: `self.calibrated`) reports the raw model's probabilities; the labels are the same
        (a multi-label set is still cut at the thresholds on the calibrated probabilities, where they were tuned).

        coverage=0.9 (any of 0.50 .. 0.99) adds `label_set`: the labels, most probable first, whose set holds the
        true label at least that share of the time (evaluation/conformal.py; multi-label: at least that share of a
        text's true labels on average), fitted on validation and taken on the calibrated probabilities. It may be
        empty where the model is surer than the level needs; the same text always gets the same set."""
        import numpy as np

        from .evaluation import conformal  # (numpy only)

        cut = self.label_set_cut(coverage) if coverage is not None else None
        top_k = whole_number(top_k, "top_k")
        batch_size = whole_number(batch_size, "batch_size", high=MAX_BATCH)
        self._calibrated(calibrated)
        method = explain_method(explain)
        if method == "rollout" and not hasattr(self, "_attention"):
            raise TformerError(f"explain=rollout needs the model's attention weights, which the {self.runtime} "
                               f"runtime does not give; use explain=occlusion, or the torch runtime (the checkpoint)")
        texts, filled, windows = self._encode(texts)
        blank = {"labels": [], "probabilities": {}} if self.multi_label else {"label": None, "probability": None}
        if cut is not None:  # (the keys a label set's reader looks up: no set for a text with nothing to read)
            blank.update(label_set=None, coverage=cut[0])
        results = [{"text": t, **blank, "empty": True, "top_k": []} for t in texts]
        if not filled:
            return results
        logits = self._document_logits(windows, batch_size)
        probs = self._checked(self._scaled(logits, calibrated))  # (texts, C): the numbers reported
        decided = self._checked(self._scaled(logits, True)) if self.multi_label else probs  # what labels are cut on
        order = np.argsort(-probs, axis=1, kind="stable")[:, :min(top_k, probs.shape[1])]
        names = self.labels
        for i, p, d, j in zip(filled, probs, decided, order):
            top = [{"label": names[int(c)], "probability": round(float(p[c]), 6)} for c in j]
            if self.multi_label:  # every label at or over its threshold, most probable first
                chosen = [int(c) for c in np.argsort(-p, kind="stable") if d[c] >= self.thresholds[c]]
                results[i] = {"text": texts[i], "labels": [names[c] for c in chosen],
                              "probabilities": {names[c]: round(float(p[c]), 6) for c in chosen}, "top_k": top}
            else:
                results[i] = {"text": texts[i], "label": names[int(j[0])], "probability": round(float(p[j[0]]), 6),
                              "top_k": top}
        if cut is not None:
            # label sets are taken on calibrated probabilities (where the cuts were fitted): --raw changes the
            # numbers shown, not them
            calibrated_probs = decided if self.multi_label or self._calibrated(calibrated) \
                else self._checked(self._scaled(logits, True))
            level, at = cut
            inside = conformal.sets(calibrated_probs, at, self.multi_label, conformal.token_uniforms(windows))
            for i, p, row in zip(filled, calibrated_probs, inside):
                results[i]["label_set"] = [names[int(c)] for c in np.argsort(-p, kind="stable") if row[c]]
                results[i]["coverage"] = level
        if method == "occlusion":
            # word weights are falls of the probability shown (--raw: the model's own), beside the number they explain
            shown = self._calibrated(calibrated)
            for i, exp in zip(filled, self._occlusion([texts[i] for i in filled], probs, batch_size, shown)):
                results[i]["explanation"] = exp
        elif method == "rollout":  # of each text's first window (its only one unless long_text=chunks)
            weights = self._attention([ws[0][0] for ws in windows], batch_size)
            for i, ws, w in zip(filled, windows, weights):
                results[i]["explanation"] = {"method": "rollout", "tokens": ws[0][1],
                                             "last_layer": [round(x, 6) for x in w["last"]],
                                             "rollout": [round(x, 6) for x in w["rollout"]]}
        return results

    def _occlusion(self, texts: list[str], probs, batch_size: int, calibrated: bool = True) -> list[dict]:
        """Per text, each word's weight: how much the probability `probs` gives the text's top label (the answer; a
        multi-label model's most probable label) falls when that word alone is deleted (negative: the word spoke
        against it), on the scale `probs` is on (calibrated, or the model's own). One forward pass per word, a
        text's variants batched together; only a text's first OCCLUDED_WORDS words are tried (later ones get None:
        not measured, which 0.0 would claim)."""
        import numpy as np

        out = []
        for t, p in zip(texts, probs):  # a text at a time: memory holds one text's variants
            c = int(np.argmax(p))
            spans = [m.span() for m in WORD.finditer(t)]
            n = min(len(spans), OCCLUDED_WORDS)
            variants = [t[:a] + t[b:] for a, b in spans[:n]]
            cut = self.predict_proba(variants, batch_size=batch_size, calibrated=calibrated)[:, c] if n else \
                np.zeros(0)
            if np.isnan(cut).any():  # a text of one word, deleted: what the model answers with no words at all
                cut = np.where(np.isnan(cut), self._no_words(batch_size, calibrated)[c], cut)
            rest = cut
            out.append({"method": "occlusion", "label": self.labels[c], "words": [t[a:b] for a, b in spans],
                        "weights": [round(float(p[c] - x), 6) + 0.0 for x in rest] + [None] * (len(spans) - n)})
        return out

    def _no_words(self, batch_size: int, calibrated: bool = True):
        """The probabilities (calibrated, or the model's own) of a text with no words, its special tokens alone:
        what deleting a one-word text's only word leaves (a uniform answer would mean nothing to a multi-label
        model's independent labels)."""
        import numpy as np
        from .data.tokenization import encode_batch

        probs = self._probabilities(encode_batch(self._tok, [""], self._max_len, self._long_text), batch_size,
                                    calibrated)[0]
        return probs if bool(np.isfinite(probs).all()) else np.full(len(probs), 1.0 / len(probs))

    @property
    def word_pieces(self):
        """How this model's tokenizer spells words (data.tokenization.WordPieces): to show an explanation's tokens
        as whole words, whatever the tokenizer's scheme (WordPiece '##', byte-level BPE 'Ġ', SentencePiece '▁')."""
        from .data.tokenization import word_pieces

        return word_pieces(self._tok)

    def explain(self, texts, *, method: str = "occlusion", batch_size: int = 64) -> list[dict]:
        """`predict(texts, explain=method)`: which words (occlusion) or tokens (rollout) drove each decision."""
        return self.predict(texts, explain=method, batch_size=batch_size)


def given_texts(texts) -> list[str]:
    """What predict / predict_proba / explain were given, as a list of strings, or one line saying what to pass: a
    DataFrame or a dict would be iterated over its column names or keys, and those labelled as if they were texts."""
    if isinstance(texts, str):
        raise TformerError("texts must be a list of strings, not one string (wrap it: [text])")
    if isinstance(texts, Mapping) or hasattr(texts, "columns"):
        raise TformerError(f"texts must be a list of strings (or a Series), not a {type(texts).__name__}, whose "
                           f"iteration gives its column names or keys: pass its text column, e.g. df['text']")
    try:
        texts = list(texts)
    except TypeError:
        raise TformerError(f"texts must be a list of strings, not {type(texts).__name__}") from None
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise TformerError(f"texts[{bad}] is {type(texts[bad]).__name__} ({texts[bad]!r:.40}), not a string; pass "
                           f"strings (a missing text as '')")
    return texts


# Explanations. occlusion (the default): delete each word in turn and watch the answer's probability: what the
# model does, for every family, pooling and runtime, at one forward pass per word. rollout: attention rollout
# (Abnar & Zuidema 2020), the torch runtime only; cheap, but on pretrained mean-pooled encoders nearly flat and
# spread over word pieces.
EXPLAIN_METHODS = ("occlusion", "rollout")
WORD = re.compile(r"\w+(?:['\u2019]\w+)*|[^\w\s]")  # a word (its apostrophes kept: hasn't) or one punctuation mark
OCCLUDED_WORDS = 512  # words tried per text (one forward pass each); later words' weights are None


def explain_method(explain) -> str | None:
    """predict's `explain`: False/None (none), True (occlusion) or a method's name."""
    if explain is None or explain is False:
        return None
    if explain is True:
        return "occlusion"
    if isinstance(explain, str) and explain in EXPLAIN_METHODS:
        return explain
    raise TformerError(f"explain={explain!r:.40} must be true, false, or one of {', '.join(EXPLAIN_METHODS)}")


# Below this many floating-point operations (2 x tokens x the encoder's matrix weights) a forward pass takes tens
# of milliseconds on one core: more threads only add their start-up and, on a busy machine, waits for a descheduled
# peer at every barrier (`tformer predict "one text"` spent more time there than in the model).
LITTLE_WORK_FLOPS = 2e9


def threads_by_work() -> None:
    """For a process of its own (the CLI's predict): CPU work runs on one thread until a batch of texts is known
    to be more than a little work, then on torch's usual count. A library caller's thread settings are left
    alone (Classifier.cpu_threads stays None)."""
    import torch

    if Classifier.cpu_threads is None:  # (twice in one process: the first count is the usual one)
        Classifier.cpu_threads = torch.get_num_threads()
    torch.set_num_threads(1)


class Classifier(TextPredictor):
    runtime = "torch"
    cpu_threads: int | None = None  # set by threads_by_work: the thread count for more than a little work

    def __init__(self, loaded, tokenizer, device, long_text):
        self._loaded, self._tok, self.device, self._long_text = loaded, tokenizer, device, long_text
        self._max_len = int(loaded.model_config["max_len"])
        self.multi_label, self.thresholds = bool(loaded.model.cfg.multi_label), loaded.thresholds
        self.temperature, self.conformal = loaded.temperature, loaded.conformal

    @classmethod
    def load(cls, checkpoint: str | Path | None = None, *, device: str = "auto",
             outputs_dir: str | Path = "outputs", key: str = "checkpoint") -> "Classifier":
        """A run dir (its best checkpoint), a checkpoint dir, or None: the newest run's (a sweep's best job). key: how
        the caller's user named it (predict's --checkpoint), for the messages."""
        from .data.tokenization import LongText, load_tokenizer
        from .hardware import pick_device
        from . import checkpoint as ckpt
        from .store.locate import locate

        path = locate(checkpoint, outputs_dir, key=key)
        dev = pick_device(device, "device")
        loaded = ckpt.load(path, dev)
        long_text = LongText.from_meta(loaded.meta)
        tok = load_tokenizer(loaded.tokenizer_file, int(loaded.model_config["max_len"]), long_text)
        return cls(loaded, tok, dev, long_text)

    @property
    def labels(self) -> list[str]:
        return list(self._loaded.label_names)

    @property
    def path(self) -> Path:
        return Path(self._loaded.path)

    def __repr__(self) -> str:
        return f"Classifier({str(self.path)!r}, labels={self.labels}, device={self.device.type})"

    def _document_logits(self, windows, batch_size: int):
        from .data.tokenization import TokenizedSplit, pad_id
        from .hardware import pick_precision
        from .inference import predict_logits

        split = TokenizedSplit.from_windows(windows)
        if self.cpu_threads and self.device.type == "cpu":
            self._fit_threads(int(split.lengths.sum()))
        precision = pick_precision("fp32" if self.device.type == "cpu" else "auto", self.device)
        logits, _ = predict_logits(self._loaded.model, split, batch_size=batch_size, pad_id=pad_id(self._tok),
                                   device=self.device, precision=precision)
        return logits.numpy()

    def embed(self, texts, *, batch_size: int = 64):
        """(len(texts), d_model) float32: each text's pooled encoder vector, the features the head reads, to
        compare texts as this model sees them (`tformer suggest` spreads its picks by them). A text read as
        several windows (long_text=chunks) gets their mean; an empty text a row of NaN, as in predict_proba."""
        import numpy as np
        import torch

        from .data.batching import BatchLoader
        from .data.tokenization import TokenizedSplit, pad_id
        from .hardware import pick_precision
        from .inference import document_logits

        batch_size = whole_number(batch_size, "batch_size", high=MAX_BATCH)
        model = self._loaded.model
        texts, filled, windows = self._encode(texts)
        out = np.full((len(texts), model.cfg.d_model), np.nan, dtype=np.float32)
        if not filled:
            return out
        split = TokenizedSplit.from_windows(windows)
        if self.cpu_threads and self.device.type == "cpu":
            self._fit_threads(int(split.lengths.sum()))
        precision = pick_precision("fp32" if self.device.type == "cpu" else "auto", self.device)
        pooled = torch.empty(len(split), model.cfg.d_model)  # (windows, D)
        model.eval()
        with torch.inference_mode():
            for batch in BatchLoader(split, batch_size, pad_id(self._tok), shuffle=False):
                ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
                with precision.autocast():
                    pooled[batch["index"]] = model.features(ids, mask).float().cpu()
        out[filled] = self._checked(document_logits(pooled, split.docs).numpy())  # windows -> documents (n, D)
        return out

    def _fit_threads(self, tokens: int) -> None:
        """One thread for a little work; else the process's share of the cores (the server claims one: cores.py),
        or torch's usual count."""
        import torch

        weights = sum(m.weight.numel() for m in self._loaded.model.modules() if isinstance(m, torch.nn.Linear))
        share = cores.active()
        many = min(self.cpu_threads, share.threads) if share is not None else self.cpu_threads
        torch.set_num_threads(1 if 2 * tokens * weights < LITTLE_WORK_FLOPS else many)

    def _attention(self, ids: list[list[int]], batch_size: int) -> list[dict]:
        """Per sequence: {'last': [...], 'rollout': [...]} token weights (special tokens included)."""
        import torch

        from .data.batching import collate
        from .data.tokenization import TokenizedSplit, pad_id

        split, pad, model = TokenizedSplit.from_ids(ids), pad_id(self._tok), self._loaded.model
        if not model.cfg.n_layers:
            raise TformerError(f"{self.path} is a static model (no attention layers): explain=rollout has no "
                               f"attention to roll out; use explain=occlusion (--explain)")
        out: list[dict] = [{} for _ in range(len(split))]
        for start in range(0, len(split), batch_size):
            idx = torch.arange(start, min(start + batch_size, len(split)))
            batch = collate(split, idx, pad)
            weights = model.explain(batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device))
            for row, i in enumerate(idx.tolist()):
                n = int(batch["attention_mask"][row].sum())
                out[i] = {name: w[row, :n].float().cpu().tolist() for name, w in weights.items()}
        return out
