"""CLM's worker engine: projection heads over the vectors the gateway sends, and the readout.

`Job.vectors` holds each distinct text's vector once (float32 in host byte order: gateway and
worker share a host) and `Job.vector_index` which rows each question uses, so 400 questions
over the same 255 labels carry 255 option rows, not 102,000. Rows are L2-normalised in numpy
with upstream's exact float32 operations (at scale 100 a last-bit difference in the norm shows
in the probabilities), and the readout is `softmax(scale * cos / temperature)` as in upstream
`contrastive-lm` 0.1.0.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from decidealot.contract import Answer, Question, ScoreQuestion
from decidealot.jobs import Decision, EngineSpec, Job, PassShape
from decidealot.providers.clm.render import option_keys, score_legend
from decidealot.providers.clm.worker.head import HeadFileError, HeadPair, load_heads
from decidealot.providers.worker.readout import answer_from_probabilities, first_max, softmax

FLOAT32_BYTES = 4
_NORM_EPS = 1e-12  # upstream's l2: v / (|v| + 1e-12)


@dataclass(frozen=True)
class ClmPreparedJob:
    """One job's vectors, checked against its questions, waiting for a pass. The job is one
    row of a pass: the heads are tiny, and a job's answers then match upstream's, and its own
    answers alone, to the bit."""

    tokens: int
    """Distinct vectors this job adds to a pass."""
    group: str
    """The checkpoint key: jobs of one head share a pass."""
    job: Job
    vectors: torch.Tensor
    """Unit-length float32 rows, each distinct vector once."""
    state_rows: torch.Tensor
    """Per question, its state's row in `vectors`."""
    option_rows: torch.Tensor
    """Every question's option rows in `vectors`, question after question."""
    option_counts: list[int]
    input_tokens = 0  # the head reads vectors; the gateway adds the encoder's prompt tokens

    @property
    def rows(self) -> list[ClmPreparedJob]:
        return [self]


def confidence(probs: Sequence[float]) -> float:
    """Top probability minus the mean of the others, clamped to [0, 1]; 1 for one option."""
    if len(probs) < 2:
        return 1.0
    best = first_max(probs)
    rest = [p for i, p in enumerate(probs) if i != best]
    return max(0.0, min(1.0, probs[best] - sum(rest) / len(rest)))


def answer(question: Question, logits: list[float]) -> Answer:
    """Upstream's readout; nothing is rounded. A noul's options are `NOUL_KEYS`, [false, true]."""
    legend = score_legend(question) if isinstance(question, ScoreQuestion) else None
    return answer_from_probabilities(
        question, softmax(logits), confidence, true_index=1, legend=legend
    )


class ClmEngine:
    """Serves one or more head files by checkpoint key; every head loads at creation."""

    shape = PassShape()

    def __init__(self, heads: dict[str, HeadPair], device: str):
        self._heads = heads
        self._device = device

    def prepare(self, job: Job) -> ClmPreparedJob:
        heads = self._heads.get(job.checkpoint)
        if heads is None:
            raise ValueError(f"unknown CLM checkpoint {job.checkpoint!r}")
        counts = [len(option_keys(q)) for q in job.questions.values()]
        width = heads.cfg.hidden_size
        rows, odd = divmod(len(job.vectors), width * FLOAT32_BYTES)
        if odd:
            raise ValueError(
                f"CLM job carries {len(job.vectors)} vector bytes, not whole rows of {width} "
                "float32"
            )
        index = np.asarray(job.vector_index, dtype=np.int64)
        if len(index) != len(counts) + sum(counts) or not ((index >= 0) & (index < rows)).all():
            raise ValueError(
                f"CLM job's vector index has {len(index)} entries for {rows} rows; its "
                f"questions need {len(counts) + sum(counts)} entries within those rows"
            )
        is_state = np.zeros(len(index), dtype=bool)
        is_state[np.cumsum([0, *(count + 1 for count in counts[:-1])])] = True
        raw = np.frombuffer(job.vectors, dtype=np.float32).reshape(rows, width)
        unit = raw / (np.linalg.norm(raw, axis=-1, keepdims=True) + _NORM_EPS)
        return ClmPreparedJob(
            rows,
            job.checkpoint,
            job,
            torch.from_numpy(unit),
            torch.from_numpy(index[is_state]),
            torch.from_numpy(index[~is_state]),
            counts,
        )

    @torch.inference_mode()
    def forward(self, group: Hashable, rows: Sequence[ClmPreparedJob]) -> list[Decision]:
        heads = self._heads[str(group)]
        return [self._decide(heads, prepared) for prepared in rows]

    def finish(self, prepared: ClmPreparedJob, outputs: Sequence[object]) -> Decision:
        (decision,) = outputs
        assert isinstance(decision, Decision)
        return decision

    def _decide(self, heads: HeadPair, prepared: ClmPreparedJob) -> Decision:
        unit = prepared.vectors.to(self._device)
        # each distinct row through its tower once; questions then gather their projections
        state_ids, state_of = torch.unique(prepared.state_rows, return_inverse=True)
        option_ids, option_of = torch.unique(prepared.option_rows, return_inverse=True)
        states = heads.state(unit[state_ids.to(self._device)])
        options = heads.action(unit[option_ids.to(self._device)])
        option_of = option_of.to(self._device)
        temperature = float(prepared.job.config.get("temperature", 1.0))
        answers: dict[str, Answer] = {}
        option_at = 0
        for state_at, ((name, question), count) in enumerate(
            zip(prepared.job.questions.items(), prepared.option_counts, strict=True)
        ):
            cos = options[option_of[option_at : option_at + count]] @ states[state_of[state_at]]
            # float32 like upstream, then a float64 softmax
            logits = (heads.scale * cos / temperature).tolist()
            answers[name] = answer(question, logits)
            option_at += count
        return Decision(model=prepared.group, answers=answers, input_tokens=0)


def create(spec: EngineSpec) -> ClmEngine:
    """Load every head weights-only; a head whose input width is not the encoder's (the
    gateway's `options["width"]`, 4096 for Qwen3-8B) fails here."""
    width = int(spec.options["width"])
    heads: dict[str, HeadPair] = {}
    for key, path in spec.checkpoints.items():
        pair = load_heads(Path(path), spec.device)
        if pair.cfg.hidden_size != width:
            raise HeadFileError(
                f"CLM head {Path(path).name} expects {pair.cfg.hidden_size}-wide vectors; "
                f"the encoder gives {width}"
            )
        heads[key] = pair
    return ClmEngine(heads, spec.device)
