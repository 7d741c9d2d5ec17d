"""Defaults that depend on what is installed, decided without importing torch (the server CLI needs them)."""

from __future__ import annotations

from pathlib import Path

from completion_engine.config import DEFAULT_TARGET

DISTILLED_NAME = "smollm2-135m-draft"
DISTILLED_DIR = Path(__file__).resolve().parent / "data" / DISTILLED_NAME
DISTILLED_WEIGHTS = "draft.safetensors"
EAGLE_NAME = "smollm2-135m-eagle"  # the EAGLE head for the embedded target (drafting/eagle.py)
EAGLE_DIR = Path(__file__).resolve().parent / "data" / EAGLE_NAME
EAGLE_WEIGHTS = "eagle.safetensors"
EAGLE_CONFIG = "eagle.json"


def default_draft_model(target: str) -> str | None:
    """The shipped draft for the embedded target: its EAGLE head, else the distilled draft (whichever is
    installed). The head drafts more per verify step, so `hybrid` with it ran faster than with the
    distilled draft on both packages benchmarked (README, "The EAGLE draft head")."""
    if target != DEFAULT_TARGET:
        return None
    for name, weights in (
        (EAGLE_NAME, EAGLE_DIR / EAGLE_WEIGHTS),
        (DISTILLED_NAME, DISTILLED_DIR / DISTILLED_WEIGHTS),
    ):
        if weights.exists():
            return name
    return None


def default_draft_method(draft_model: str | None) -> str:
    """hybrid when a draft model is there (n-gram matches first, the model elsewhere), else ngram."""
    return "hybrid" if draft_model else "ngram"


def is_eagle_head(spec: str) -> bool:
    """Does --draft-model name an EAGLE head: the shipped one, or a folder train-draft --kind eagle wrote?"""
    return spec == EAGLE_NAME or (Path(spec) / EAGLE_CONFIG).is_file()
