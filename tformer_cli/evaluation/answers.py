"""How `tformer predict` shows its answers: a table (top-k and label-set columns when asked), and for --explain each
text with its words shaded by their weight in a terminal, or followed by the weight as a number elsewhere.
rich is imported where it is used: predict --json and runtime=onnx never load it (their cold start)."""
from __future__ import annotations

from ..console import screen_console
from ..safe_text import json_line, rich, terminal


def print_table(results: list[dict], k: int, explained: bool, pieces=None) -> None:
    """The answers as a rich table (top-k column when k > 1), then the explanations (their tokens glued into words
    by `pieces`, the model's tokenizer's WordPieces)."""
    from rich.table import Table  # deferred: predict's cold start (see the module docstring)

    table = Table(header_style="bold", show_lines=False)
    table.add_column("text", overflow="fold", max_width=70)
    table.add_column("label")
    table.add_column("probability", justify="right")
    if k > 1:
        table.add_column(f"top {k}")
    level = next((r["coverage"] for r in results if "coverage" in r), None)
    if level is not None:
        table.add_column(f"set at {level:.2f}")
    extra = (k > 1) + (level is not None)
    for r in results:
        if r.get("empty"):
            table.add_row(rich(repr(r["text"])), "(empty)", "-", *(["-"] * extra))
            continue
        text = r["text"] if len(r["text"]) <= 200 else r["text"][:197] + "..."
        if "labels" in r:  # multi-label: the label set, each with its probability
            row = [rich(text), rich(", ".join(r["labels"]) or "(none)"),
                   " ".join(f"{p:.3f}" for p in r["probabilities"].values()) or "-"]
        else:
            row = [rich(text), rich(r["label"]), f"{r['probability']:.3f}"]
        if k > 1:
            row.append(rich(", ".join(f"{x['label']} {x['probability']:.3f}" for x in r["top_k"])))
        if level is not None:  # empty: the model is surer than the level needs
            row.append(rich("{" + ", ".join(r["label_set"]) + "}"))
        table.add_row(*row)
    console = screen_console()
    console.print(table)
    if level is not None and any(r.get("label_set") == [] and "label" in r for r in results):  # (single-label:
        # multi-label sets are the labels over a cut, and an empty one means none reached it)
        console.print(f"{{}}: an empty set: the model is surer than the level {level:.2f} needs (sets are randomised "
                      f"to cover the level, not more); its label is the answer", highlight=False)
    for i, r in enumerate(results if explained else [], 1):
        row = f"{i}. " if len(results) > 1 else ""  # (the table's rows in order: an empty text has no words)
        if r.get("empty"):
            if row:
                console.print(f"{row}(an empty text: nothing to explain)", highlight=False)
            continue  # shading is lost in a file or a pipe: there each word carries its weight as a number
        console.print(render_explanation(r, pieces, row) if console.is_terminal else plain_explanation(r, pieces, row))


def print_json_lines(results: list[dict], k: int) -> None:
    """One JSON line per answer (--json), control characters escaped; the top-k list only when k > 1."""
    for r in results:
        if k == 1:
            r.pop("top_k")
        print(json_line(r))


def words_and_weights(tokens: list[str], weights: list[float], pieces=None) -> list[tuple[str, float]]:
    """Glue a word's pieces back together, summing their weights; drop the special tokens. pieces: the tokenizer's
    `data.tokenization.WordPieces` (None: BERT's: '##ing' continues a word, [CLS] [SEP] [PAD] dropped); byte-level
    BPE ('Ġgood') and SentencePiece ('▁good') mark the piece that begins a word instead."""
    marker, starts = (pieces.marker, pieces.starts_word) if pieces is not None else ("##", False)
    specials = pieces.specials if pieces is not None else ("[CLS]", "[SEP]", "[PAD]")
    words: list[list] = []  # [pieces, weight]
    after_special = True
    for t, w in zip(tokens, weights):
        if t in specials:
            after_special = True
            continue
        continues = not t.startswith(marker) if starts else bool(marker) and t.startswith(marker)
        if continues and words and not after_special:
            words[-1][0].append(t)
            words[-1][1] += w
        else:
            words.append([[t], w])
        after_special = False
    decode = pieces.decode if pieces is not None and pieces.decode is not None else None
    return [(_spelled(p, marker, starts, decode), w) for p, w in words]


def _spelled(pieces: list[str], marker: str, starts: bool, decode) -> str:
    """A word's pieces as its text: through the tokenizer's decoder when there is one (byte-level pieces are
    bytes: 'Ã©' is é), else without their markers."""
    word = decode(pieces).strip() if decode is not None else ""
    if word:
        return word
    if starts:
        return "".join(pieces).removeprefix(marker) if marker else "".join(pieces)
    return pieces[0] + "".join(p.removeprefix(marker) for p in pieces[1:])


def _head(result: dict) -> str:
    return (f"{result['label']} {result['probability']:.3f}" if "label" in result
            else ", ".join(result["labels"]) or "(no label)")


def _pairs(result: dict, pieces=None) -> tuple[str, list[tuple[str, float]]]:
    """(the method, its (word, weight) pairs): occlusion's words as they are; rollout's tokens glued into words."""
    exp = result["explanation"]
    if exp.get("method") == "occlusion":
        return "occlusion", list(zip(exp["words"], exp["weights"]))
    return "rollout", words_and_weights(exp["tokens"], exp["rollout"], pieces)


def plain_explanation(result: dict, pieces=None, row: str = ""):
    """The text with each word's weight after it, `superb(+0.41)` (occlusion: the fall in the answer's probability
    when the word is deleted; rollout: its attention share): what the shading says, for a file."""
    from rich.text import Text  # deferred: predict's cold start

    method, pairs = _pairs(result, pieces)
    shown = "{:+.2f}" if method == "occlusion" else "{:.2f}"
    words = " ".join(terminal(word) if w is None else f"{terminal(word)}({shown.format(w)})" for word, w in pairs)
    return Text(f"{row}{terminal(_head(result))} [{method}]: {words}")


def render_explanation(result: dict, pieces=None, row: str = ""):
    """The text with each word's background as strong as its weight (red: for the answer; blue: against it)."""
    from rich.text import Text  # deferred: predict's cold start

    method, pairs = _pairs(result, pieces)
    top = max((abs(w) for _, w in pairs if w is not None), default=1.0) or 1.0
    text = Text(f"{row}{terminal(_head(result))} [{method}]: ", style="bold")
    for word, w in pairs:
        if w is None:  # (past the words occlusion measures)
            text.append(terminal(word) + " ")
            continue
        level = int(255 - 180 * (abs(w) / top))
        colour = f"rgb(255,{level},{level})" if w > 0 else f"rgb({level},{level},255)"
        text.append(terminal(word), style=f"black on {colour}" if abs(w) / top > 0.15 else "")
        text.append(" ")
    return text
