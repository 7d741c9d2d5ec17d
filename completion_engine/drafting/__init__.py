"""Drafters: one module each, behind the Drafter protocol in base.py."""

from completion_engine.drafting.base import Drafter
from completion_engine.drafting.hybrid import HybridDrafter
from completion_engine.drafting.model import ModelDrafter
from completion_engine.drafting.ngram import DocumentCorpus, NgramDrafter

__all__ = ["Drafter", "DocumentCorpus", "HybridDrafter", "ModelDrafter", "NgramDrafter"]
