"""The one rule for a text that says nothing: no character that shows. The loaders drop such texts, predict marks
them empty, the checks count them. Imports nothing: `predict`'s cold start reads it."""
from __future__ import annotations

import unicodedata

# Unicode categories that draw nothing on their own: separators (Zs, Zl, Zp: spaces, line breaks), controls (Cc),
# format characters (Cf: U+200B ZERO WIDTH SPACE, ...), surrogates (Cs) and non-spacing or enclosing marks (Mn, Me:
# combining accents, which decorate a character that is not there). Unassigned (Cn: an emoji newer than Python's
# Unicode tables), private-use (Co) and spacing marks (Mc) may well show, so they count as visible.
_INVISIBLE_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Mn", "Me"})


def has_visible(text: str) -> bool:
    """True when the text has a character that shows: anything but spaces, controls, format characters and
    combining marks. A text without one carries nothing to classify: the loaders drop it, predict marks it empty.
    Stops at the first visible character, so long texts cost next to nothing."""
    return any(unicodedata.category(ch) not in _INVISIBLE_CATEGORIES for ch in text)
