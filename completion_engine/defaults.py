"""Defaults that depend on what is installed, decided without importing torch (the server CLI needs them)."""

from __future__ import annotations

from pathlib import Path

from completion_engine.config import DEFAULT_TARGET

DISTILLED_NAME = "smollm2-135m-draft"
DISTILLED_DIR = Path(__file__).resolve().parent / "data" / DISTILLED_NAME
DISTILLED_WEIGHTS = "draft.safetensors"


def default_draft_model(target: str) -> str | None:
    """The shipped distilled draft for the embedded target, when its weights are installed."""
    if target == DEFAULT_TARGET and (DISTILLED_DIR / DISTILLED_WEIGHTS).exists():
        return DISTILLED_NAME
    return None


def default_draft_method(draft_model: str | None) -> str:
    """hybrid when a draft model is there (n-gram matches first, the model elsewhere), else ngram."""
    return "hybrid" if draft_model else "ngram"


EAGLE_NAME = "smollm2-135m-eagle"  # the EAGLE head for the embedded target (drafting/eagle.py)
EAGLE_DIR = Path(__file__).resolve().parent / "data" / EAGLE_NAME
EAGLE_WEIGHTS = "eagle.safetensors"
EAGLE_CONFIG = "eagle.json"


def is_eagle_head(spec: str) -> bool:
    """Does --draft-model name an EAGLE head: the shipped one, or a folder train-draft --kind eagle wrote?"""
    return spec == EAGLE_NAME or (Path(spec) / EAGLE_CONFIG).is_file()
