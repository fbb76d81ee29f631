"""How `tformer predict` shows its answers: a table (top-k column when asked), and for --explain each text with
its words shaded by their attention-rollout weight in a terminal, or followed by the weight as a number elsewhere.
rich is imported where it is used: predict --json and runtime=onnx never load it (their cold start)."""
from __future__ import annotations

from ..console import screen_console
from ..safe_text import rich, terminal


def print_table(results: list[dict], k: int, explained: bool) -> None:
    """The answers as a rich table (top-k column when k > 1), then the explanations."""
    from rich.table import Table  # deferred: predict's cold start (see the module docstring)

    table = Table(header_style="bold", show_lines=False)
    table.add_column("text", overflow="fold", max_width=70)
    table.add_column("label")
    table.add_column("probability", justify="right")
    if k > 1:
        table.add_column(f"top {k}")
    for r in results:
        if r.get("empty"):
            table.add_row(rich(repr(r["text"])), "(empty)", "-", *(["-"] if k > 1 else []))
            continue
        text = r["text"] if len(r["text"]) <= 200 else r["text"][:197] + "..."
        if "labels" in r:  # multi-label: the label set, each with its probability
            row = [rich(text), rich(", ".join(r["labels"]) or "(none)"),
                   " ".join(f"{p:.3f}" for p in r["probabilities"].values()) or "-"]
        else:
            row = [rich(text), rich(r["label"]), f"{r['probability']:.3f}"]
        if k > 1:
            row.append(rich(", ".join(f"{x['label']} {x['probability']:.3f}" for x in r["top_k"])))
        table.add_row(*row)
    console = screen_console()
    console.print(table)
    for r in results if explained else []:
        if not r.get("empty"):  # shading is lost in a file or a pipe: there each word carries its weight as a number
            console.print(render_explanation(r) if console.is_terminal else plain_explanation(r))


def words_and_weights(tokens: list[str], weights: list[float]) -> list[tuple[str, float]]:
    """Glue WordPiece continuations ('##ing') back onto their word, summing their weights; drop [CLS]/[SEP]."""
    words: list[list] = []
    for t, w in zip(tokens, weights):
        if t in ("[CLS]", "[SEP]", "[PAD]"):
            continue
        if t.startswith("##") and words:
            words[-1][0] += t[2:]
            words[-1][1] += w
        else:
            words.append([t, w])
    return [(t, w) for t, w in words]


def _head(result: dict) -> str:
    return (f"{result['label']} {result['probability']:.3f}" if "label" in result
            else ", ".join(result["labels"]) or "(no label)")


def plain_explanation(result: dict):
    """The text with each word's rollout weight after it, `superb(0.41)`: what the shading says, for a file."""
    from rich.text import Text  # deferred: predict's cold start

    exp = result["explanation"]
    words = " ".join(f"{terminal(word)}({w:.2f})" for word, w in words_and_weights(exp["tokens"], exp["rollout"]))
    return Text(f"{terminal(_head(result))}: {words}")


def render_explanation(result: dict):
    """The text with each word's background as strong as its rollout weight (rich markup)."""
    from rich.text import Text  # deferred: predict's cold start

    exp = result["explanation"]
    pairs = words_and_weights(exp["tokens"], exp["rollout"])
    top = max((w for _, w in pairs), default=1.0) or 1.0
    text = Text(f"{terminal(_head(result))}: ", style="bold")
    for word, w in pairs:
        level = int(255 - 180 * (w / top))
        text.append(terminal(word), style=f"black on rgb(255,{level},{level})" if w / top > 0.15 else "")
        text.append(" ")
    return text
