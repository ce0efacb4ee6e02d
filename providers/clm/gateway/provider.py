"""The CLM provider (gateway side; never imports torch, even indirectly).

`accept` renders, bounds and de-duplicates a request's texts before any wait (422s, never
truncation); `make` embeds them inside the residency hold, on the lane CLM shares with Laya and
Von unless `clm_parallel_with_local_models` (docs/models.md, "Residency and lanes").
"""

from __future__ import annotations

import asyncio
from dataclasses import KW_ONLY, dataclass

from decidealot.contract import Json, ModelInfo, SystemOneRequest
from decidealot.errors import RequestInvalid, over_token_limit
from decidealot.jobs import Job
from decidealot.protocols import LocalRuntime, MadeJob
from decidealot.providers.clm.gateway.encoder_client import EncoderClient
from decidealot.providers.clm.render import render_questions
from decidealot.providers.engine.protocol import MAX_FRAME_BYTES

CHECKPOINT = "clm-0.1-8b"
QWEN3_8B_WIDTH = 4096  # the contract: exactly 4096 floats per input, Qwen3-8B's hidden size
MAX_VECTORS = MAX_FRAME_BYTES // (2 * QWEN3_8B_WIDTH * 4)
"""Distinct vectors one request may carry (32768, 512 MiB of float32): half a worker frame,
so no request reaches the frame limit, whatever DECIDEALOT_MAX_REQUEST_TOKENS allows."""
_DIGITS = b"0123456789"


def estimated_tokens(text: str) -> int:
    """The encoder tokens `text` costs, from its UTF-8 bytes: `1 + digits + ⌈other bytes / 2⌉`,
    never below half of Qwen3's count, above it for prose, JSON and code (docs/models.md, "CLM")."""
    raw = text.encode()
    rest = len(raw.translate(None, _DIGITS))
    return 1 + (len(raw) - rest) + -(-rest // 2)


def encoder_texts(
    request: SystemOneRequest, max_text_bytes: int
) -> tuple[list[str], list[str], list[int]]:
    """A request's state and option texts, each distinct text once, and `Job.vector_index`; a
    text over `max_text_bytes` is refused, never truncated. CPU work: run it off the loop."""
    states: dict[str, int] = {}
    options: dict[str, int] = {}
    texts: list[list[int]] = []  # per question: its state text, then its option texts
    for name, question in render_questions(request.state, request.questions):
        bounded = [(question.state_text, "state plus instructions render", None)]
        bounded += [(c.text, "option text renders", c.loc) for c in question.candidates]
        for text, what, loc in bounded:
            if (size := len(text.encode())) > max_text_bytes:
                raise RequestInvalid.question(
                    name,
                    f"{what} to {size} UTF-8 bytes; CLM accepts at most {max_text_bytes} "
                    "(DECIDEALOT_CLM_MAX_TEXT_BYTES)",
                    loc=loc,
                )
        texts.append([states.setdefault(question.state_text, len(states))])
        texts[-1] += [options.setdefault(c.text, len(options)) for c in question.candidates]
    index: list[int] = []
    for state, *option_texts in texts:  # option texts' rows follow all state texts' rows
        index += [state, *(len(states) + option for option in option_texts)]
    return list(states), list(options), index


@dataclass(frozen=True)
class ClmJobToMake:
    """An accepted request (`decidealot.protocols.JobToMake`), each distinct text once."""

    request: SystemOneRequest
    encoder: EncoderClient
    in_lane: bool
    states: list[str]
    options: list[str]
    index: list[int]  # `Job.vector_index`: the state texts' rows, then the option texts'

    @property
    def cost(self) -> int:
        """At most the `usage.input_tokens` this costs (a cold cache: docs/models.md, "CLM")."""
        texts = (*self.states, *self.options)
        return sum(map(estimated_tokens, texts)) + len(texts)

    async def make(self) -> MadeJob:
        states = await self.encoder.embed(self.states, cache=False)
        options = await self.encoder.embed(self.options, cache=True)
        job = Job(
            checkpoint=CHECKPOINT,
            state=self.request.state,
            questions=self.request.questions,
            config=self.request.config,
            vectors=b"".join((*states.rows, *options.rows)),
            vector_index=self.index,
        )
        return MadeJob(job, states.prompt_tokens + options.prompt_tokens)


@dataclass(eq=False)
class ClmProvider:
    """Encoder calls in the gateway, the head in a worker; `max_request_tokens` bounds `cost`."""

    name = "clm"
    local = True
    accepts_temperature = True

    encoder: EncoderClient
    runtime: LocalRuntime
    _: KW_ONLY
    selectors: tuple[ModelInfo, ...]
    max_text_bytes: int
    max_request_tokens: int = 0  # 0: no bound
    in_lane: bool = True

    async def start(self) -> None:
        await self.encoder.start()

    async def close(self) -> None:
        await self.encoder.close()
        await self.runtime.unload()

    def status_details(self) -> dict[str, Json]:
        return {"encoder_answered_last_call": self.encoder.answered_last_call}

    async def models(self) -> list[ModelInfo]:
        return list(self.selectors)

    async def accept(self, selector: str, request: SystemOneRequest) -> ClmJobToMake:
        texts = await asyncio.to_thread(encoder_texts, request, self.max_text_bytes)
        made = ClmJobToMake(request, self.encoder, self.in_lane, *texts)
        if (vectors := len(made.states) + len(made.options)) > MAX_VECTORS:
            raise RequestInvalid.question(
                None,
                f"this request needs {vectors} distinct encoder vectors; CLM carries at "
                f"most {MAX_VECTORS} per request: split its questions over several requests",
            )
        limit = self.max_request_tokens
        if limit and (cost := made.cost) > limit:
            raise over_token_limit(cost, limit)
        return made
