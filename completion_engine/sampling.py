"""Turning logits into the distribution we sample from: temperature, then nucleus (top-p) filtering."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Sampler:
    temperature: float
    top_p: float
    generator: torch.Generator

    @classmethod
    def seeded(cls, temperature: float, top_p: float, seed: int) -> Sampler:
        generator = torch.Generator()
        generator.manual_seed(seed)
        return cls(temperature, top_p, generator)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., vocab] logits -> [..., vocab] float32 probabilities after temperature and top-p."""
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = top_p_filter(probs, self.top_p)
        return probs

    def sample(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)
