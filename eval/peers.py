"""Peers on the same cases: stock Hugging Face `generate()` with the same model on the same machine.

- hf_plain: greedy `generate()`, the fastest plain decoding available (the speed reference).
- hf_prompt_lookup: `generate(prompt_lookup_num_tokens=k)`, HF's n-gram speculation over the prompt.
- hf_assisted: `generate(assistant_model=draft)`, HF's draft-model speculation (needs a draft model).
- hf_fp32_plain: greedy `generate()` of the same model in float32 (another model in memory).

Each generates exactly as many tokens as our plain decode did for the case, so the outputs compare
token for token. A stopping criterion notes when the first token is out, in the same call: that is
the time to first token (the prefill), and the decode phase is the rest of the call. HF keeps no KV
cache across calls: every call prefills the whole context.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

PEERS = ("hf_plain", "hf_prompt_lookup", "hf_assisted", "hf_fp32_plain")


@dataclass(frozen=True, slots=True)
class PeerRun:
    tokens: list[int]  # generated token ids
    wall_s: float  # the whole generate() call, prefill included
    ttft_s: float  # from the call to its first token

    def as_dict(self) -> dict:
        # As the engine's Stats: every generated token over the time after the first one.
        decode_s = max(self.wall_s - self.ttft_s, 0.0)
        return {
            "tokens": len(self.tokens),
            "wall_s": round(self.wall_s, 4),
            "decode_s": round(decode_s, 4),
            "decode_tokens_per_s": round(len(self.tokens) / decode_s, 2) if decode_s > 0 else 0.0,
            "ttft_s": round(self.ttft_s, 6),
        }


class FirstTokenClock(StoppingCriteria):
    """Never stops generation; notes when it is first asked, which is right after the first token."""

    def __init__(self) -> None:
        self.first: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        if self.first is None:
            self.first = time.perf_counter()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class HfPeers:
    """Stock transformers models loaded from the same folders as the engine's target and draft."""

    def __init__(
        self,
        target_source,
        draft_source=None,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        prompt_lookup_tokens: int = 10,
        names: tuple[str, ...] | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.prompt_lookup_tokens = prompt_lookup_tokens
        self.model = AutoModelForCausalLM.from_pretrained(target_source, dtype=dtype).to(self.device).eval()
        self.fp32_model = None
        if "hf_fp32_plain" in (names or PEERS):
            self.fp32_model = (
                AutoModelForCausalLM.from_pretrained(target_source, dtype=torch.float32)
                .to(self.device)
                .eval()
            )
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else eos or [])
        self.draft = None
        if draft_source is not None:
            self.draft = (
                AutoModelForCausalLM.from_pretrained(draft_source, dtype=dtype).to(self.device).eval()
            )
        available = [p for p in PEERS if p != "hf_assisted" or self.draft is not None]
        self.names = tuple(n for n in (names or available) if n in available)
        if "hf_plain" not in self.names:
            self.names = ("hf_plain", *self.names)  # the others are compared with it

    @torch.inference_mode()
    def generate(self, context: Sequence[int], new_tokens: int, peer: str = "hf_plain") -> PeerRun:
        input_ids = torch.tensor([list(context)], dtype=torch.long, device=self.device)
        options = {}
        model = self.model
        if peer == "hf_fp32_plain":
            if self.fp32_model is None:
                raise ValueError("hf_fp32_plain was not loaded (name it when building the peers)")
            model = self.fp32_model
        elif peer == "hf_prompt_lookup":
            options["prompt_lookup_num_tokens"] = self.prompt_lookup_tokens
        elif peer == "hf_assisted":
            if self.draft is None:
                raise ValueError("hf_assisted needs a draft model")
            options["assistant_model"] = self.draft
        elif peer != "hf_plain":
            raise ValueError(f"unknown peer {peer!r}")
        clock = FirstTokenClock()
        started = time.perf_counter()
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=self.model.config.eos_token_id if self.model.config.pad_token_id is None else None,
            stopping_criteria=StoppingCriteriaList([clock]),
            **options,
        )
        wall_s = time.perf_counter() - started
        tokens = output[0, input_ids.shape[1] :].tolist()
        while tokens and tokens[-1] in self.eos_ids:  # the engine keeps no EOS token either
            tokens.pop()
        ttft_s = (clock.first or started + wall_s) - started
        return PeerRun(tokens=tokens, wall_s=wall_s, ttft_s=ttft_s)

    def run_case(
        self,
        context: Sequence[int],
        new_tokens: int,
        engine_tokens: Sequence[int],
        edit_context: Sequence[int] | None = None,
    ) -> dict:
        """Every peer on one context: speed, and whether its tokens equal plain generate's (and ours).

        HF keeps no cache between calls: after an edit it prefills the whole context again, so its
        TTFT after an edit is its cold TTFT (edit_context is not run).
        """
        new_tokens = max(new_tokens, 1)
        results: dict[str, dict] = {}
        plain: PeerRun | None = None
        for name in self.names:
            run = self.generate(context, new_tokens, name)
            row = run.as_dict()
            row["prefill_tokens_per_s"] = round(len(context) / run.ttft_s, 1) if run.ttft_s > 0 else None
            if plain is None:
                plain = run
                row["equal_engine_none"] = run.tokens == list(engine_tokens[:new_tokens])
            else:
                row["equal_plain"] = run.tokens == plain.tokens
                plain_decode = plain.as_dict()["decode_s"]
                row["speedup_over_plain"] = (
                    round(plain_decode / row["decode_s"], 3) if row["decode_s"] > 0 else None
                )
            results[name] = row
        return results

    def close(self) -> None:
        """Nothing to stop: the models live in this process."""
