"""The worker's pass planner: which rows of which jobs the next forward passes hold.

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

Not thread-safe: the worker calls it under its own lock.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count

from decidealot.jobs import Decision, Engine, PassShape, PreparedJob

STARVE_TURNS = 8
"""Turns a job with rows left may be overtaken, since its rows last ran, before it goes
first."""


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
    """One forward pass: rows of one group, shortest first, with the task each belongs to."""

    group: Hashable
    rows: list[tuple[PlannedJob, int]]

    @property
    def tasks(self) -> list[PlannedJob]:
        """The tasks with rows in this pass, each once, in order of first row."""
        return list({id(task): task for task, _ in self.rows}.values())

    @property
    def padded_tokens(self) -> int:
        return len(self.rows) * max(task.prepared.rows[i].tokens for task, i in self.rows)


class Planner:
    """Jobs whose rows wait for or are in forward passes."""

    def __init__(self, token_budget: int, shape: PassShape) -> None:
        self._budget = token_budget
        self._shape = shape
        self._tasks: dict[int, PlannedJob] = {}
        self._seq = count()

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._tasks

    @property
    def has_rows(self) -> bool:
        return any(task.waiting for task in self._tasks.values())

    def add(self, job_id: int, prepared: PreparedJob) -> PlannedJob:
        rows = prepared.rows
        order = sorted(range(len(rows)), key=lambda i: rows[i].tokens)
        task = PlannedJob(
            job_id,
            prepared,
            next(self._seq),
            order,
            turns=-(-sum(row.tokens for row in rows) // self._budget),
            outputs=[None] * len(rows),
        )
        self._tasks[job_id] = task
        return task

    def remove(self, job_id: int) -> PlannedJob | None:
        """Withdraw a job (cancelled, failed or finished); rows of it already in a turn run on,
        and their outputs are dropped."""
        return self._tasks.pop(job_id, None)

    def live(self, task: PlannedJob) -> bool:
        return self._tasks.get(task.id) is task

    def take(self) -> list[PlannedPass]:
        """The next turn, cut into passes; empty when no row waits."""
        waiting = [task for task in self._tasks.values() if task.waiting]
        if not waiting:
            return []
        waiting.sort(key=lambda t: (t.overtaken < STARVE_TURNS, t.turns, t.seq))
        group = waiting[0].group
        picked: list[tuple[PlannedJob, int]] = []
        tokens = 0
        full = False
        skipped: list[PlannedJob] = []
        newest = -1
        for task in waiting:
            if full or task.group != group:
                skipped.append(task)
                continue
            took = 0
            while task.waiting:
                index = task.order[task.taken]
                cost = task.prepared.rows[index].tokens
                if picked and tokens + cost > self._budget:
                    full = True
                    break
                picked.append((task, index))
                tokens += cost
                task.taken += 1
                took += 1
            task.running += took
            if took:
                task.overtaken = 0
                newest = max(newest, task.seq)
            else:
                skipped.append(task)
        for task in skipped:
            if task.seq < newest:
                task.overtaken += 1
        picked.sort(key=lambda item: item[0].prepared.rows[item[1]].tokens)
        lengths = [task.prepared.rows[i].tokens for task, i in picked]
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
    tasks = [planner.add(i, prepared) for i, prepared in enumerate(batch)]
    while turn := planner.take():
        for each in turn:
            outputs = engine.forward(each.group, [t.prepared.rows[i] for t, i in each.rows])
            for (task, index), output in zip(each.rows, outputs, strict=True):
                task.outputs[index] = output
                task.running -= 1
    return [engine.finish(task.prepared, task.outputs) for task in tasks]
