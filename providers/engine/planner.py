"""The worker's pass planner: which rows of which jobs the next forward passes hold, and the
worker's one record of its jobs (received, and not yet answered or withdrawn).

Every job is cut into rows (`Engine.prepare`); the planner hands out *turns*: rows of one group
whose summed tokens fit the token budget (a turn always holds at least one row), cut into
passes by the engine's `PassShape` after sorting them by length. Jobs take their turns by
size class, the turns their whole work takes (their tokens over the budget, rounded up),
fewest first, and in arrival order within a class: a small request that arrives while a large
one runs gets into the next turn whole and waits about one turn, not the whole large job; the
large job fills whatever budget the small ones leave, so it keeps moving. Jobs that each fit
in a turn are served first come, first served: ordering them by their exact remaining tokens
would let every shorter newcomer overtake a slightly longer job, which then waits until the
starvation guard lets it in, and that wait is the tail. The class is the job's whole size, not
what it has left, so a large job's last turn does not go before small requests as the oldest
of their class. (What each order cost: docs/performance.md, "Real row budgets".)
A job overtaken in `STARVE_TURNS` turns since its rows last ran (each a turn that took
rows of a job that arrived after it, but none of its own) goes first next time, so a stream
of small requests cannot starve a large one. Only overtaking counts: a job waiting behind
older ones is not starved, and had it counted, every newcomer behind a queue of 8 turns would
have jumped ahead of the job whose rows the budget had just cut (its count back at 0), which
then waited for all of them.

Not thread-safe: the core calls it under its own lock.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count

from decidealot.jobs import Decision
from decidealot.providers.engine.protocol import Engine, PassShape, PreparedJob

STARVE_TURNS = 8
"""Turns a job may be overtaken, since its rows last ran, before it goes first."""


@dataclass(eq=False)
class PlannedJob:
    """A prepared job while its rows are computed."""

    id: int
    prepared: PreparedJob
    seq: int
    order: list[int]
    """Row indices, shortest first; `order[taken:]` are not handed out yet."""
    turns: int
    """Its size class: the turns its whole work takes within the budget."""
    outputs: list[object] = field(default_factory=list)
    taken: int = 0
    running: int = 0
    """Rows in turns under way."""
    overtaken: int = 0
    """Turns since this job's rows last ran that took rows of later jobs."""

    @property
    def group(self) -> Hashable:
        return self.prepared.group

    @property
    def waiting(self) -> bool:
        return self.taken < len(self.order)

    @property
    def complete(self) -> bool:
        return not self.waiting and self.running == 0


@dataclass(frozen=True)
class PlannedPass:
    """One forward pass: rows of one group, shortest first, with the job each belongs to."""

    group: Hashable
    rows: list[tuple[PlannedJob, int]]

    @property
    def jobs(self) -> list[PlannedJob]:
        """The jobs with rows in this pass, each once, in order of first row."""
        return list({id(job): job for job, _ in self.rows}.values())

    @property
    def padded_tokens(self) -> int:
        return len(self.rows) * max(job.prepared.rows[i].tokens for job, i in self.rows)


class Planner:
    """Every job the worker holds: received (None until prepared), then planned while its rows
    wait for or are in forward passes. A job leaves once answered or withdrawn."""

    def __init__(self, token_budget: int, shape: PassShape) -> None:
        self._budget = token_budget
        self._shape = shape
        self._jobs: dict[int, PlannedJob | None] = {}
        self._seq = count()

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._jobs

    @property
    def has_rows(self) -> bool:
        return any(job is not None and job.waiting for job in self._jobs.values())

    def receive(self, job_id: int) -> None:
        """A job is on its way through `prepare`."""
        self._jobs[job_id] = None

    def add(self, job_id: int, prepared: PreparedJob) -> PlannedJob:
        rows = prepared.rows
        order = sorted(range(len(rows)), key=lambda i: rows[i].tokens)
        job = PlannedJob(
            job_id,
            prepared,
            next(self._seq),
            order,
            turns=-(-sum(row.tokens for row in rows) // self._budget),
            outputs=[None] * len(rows),
        )
        self._jobs[job_id] = job
        return job

    def remove(self, job_id: int) -> bool:
        """Withdraw a job (cancelled, failed or finished); whether it was still held. Rows of it
        already in a turn run on, and their outputs are dropped."""
        return self._jobs.pop(job_id, False) is not False

    def clear(self) -> None:
        self._jobs.clear()

    def live(self, job: PlannedJob) -> bool:
        return self._jobs.get(job.id) is job

    def take(self) -> list[PlannedPass]:
        """The next turn, cut into passes; empty when no row waits."""
        waiting = [job for job in self._jobs.values() if job is not None and job.waiting]
        if not waiting:
            return []
        waiting.sort(key=lambda j: (j.overtaken < STARVE_TURNS, j.turns, j.seq))
        group = waiting[0].group
        picked: list[tuple[PlannedJob, int]] = []
        tokens = 0
        full = False
        skipped: list[PlannedJob] = []
        newest = -1
        for job in waiting:
            if full or job.group != group:
                skipped.append(job)
                continue
            took = 0
            while job.waiting:
                index = job.order[job.taken]
                cost = job.prepared.rows[index].tokens
                if picked and tokens + cost > self._budget:
                    full = True
                    break
                picked.append((job, index))
                tokens += cost
                job.taken += 1
                took += 1
            job.running += took
            if took:
                job.overtaken = 0
                newest = max(newest, job.seq)
            else:
                skipped.append(job)
        for job in skipped:
            if job.seq < newest:
                job.overtaken += 1
        picked.sort(key=lambda item: item[0].prepared.rows[item[1]].tokens)
        lengths = [job.prepared.rows[i].tokens for job, i in picked]
        return [PlannedPass(group, picked[start:stop]) for start, stop in cut(lengths, self._shape)]


def cut(lengths: Sequence[int], shape: PassShape) -> Iterator[tuple[int, int]]:
    """Split rows sorted by length into consecutive passes: a pass ends before the row that
    would take its padded size past `shape.max_tokens` or its padding past `shape.max_waste`."""
    start, real = 0, 0
    for i, length in enumerate(lengths):
        padded = length * (i - start + 1)
        real += length
        over_size = shape.max_tokens is not None and padded > shape.max_tokens
        over_waste = shape.max_waste is not None and padded - real > shape.max_waste
        if i > start and (over_size or over_waste):
            yield start, i
            start, real = i, length
    if start < len(lengths):
        yield start, len(lengths)


def run_together(
    engine: Engine, batch: Sequence[PreparedJob], token_budget: int | None = None
) -> list[Decision]:
    """Run prepared jobs in this process through the same planning as a worker (turns within
    `token_budget`, default unbounded, cut by the engine's shape): for tests and benches."""
    planner = Planner(token_budget or sys.maxsize, engine.shape)
    jobs = [planner.add(i, prepared) for i, prepared in enumerate(batch)]
    while turn := planner.take():
        for each in turn:
            outputs = engine.forward(each.group, [j.prepared.rows[i] for j, i in each.rows])
            for (job, index), output in zip(each.rows, outputs, strict=True):
                job.outputs[index] = output
                job.running -= 1
    return [engine.finish(job.prepared, job.outputs) for job in jobs]
