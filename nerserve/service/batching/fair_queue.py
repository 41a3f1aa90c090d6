"""The queue's order: fair across tenants by weight, then across requests within a tenant, with no
admitted request left behind. A pure data structure (no clocks of its own, no threads).

Two levels of fair queueing:
- **requests within a tenant** (start-time fair queueing, `quantum` sentences of a request a round):
  a request's i-th sentence is tagged with the tenant's round when it arrived plus i // quantum, and
  a tenant's sentences go by tag, then by arrival. A request of 500 sentences takes `quantum` a
  round beside the others instead of holding the graphs for its whole length. With a quantum of 1,
  equal requests that arrive together finish together, after their last batch; with a larger one
  the first of them finish a batch sooner, and the device runs the next batch while their answers
  travel, at the cost of a newcomer waiting behind up to `quantum` sentences of each request of
  its round (docs/decisions/admission.md).
- **tenants** (weighted fair queueing over the tenants that wait): each tenant's virtual time
  advances by 1 ÷ its weight for every sentence of it that runs, and the next sentence comes from
  the tenant with the least virtual time; a tenant that starts waiting starts at the system's
  virtual time (where the last batch's sentences started), so it is not charged for the time it
  did not wait, nor can it claim that time back. Without API keys every request is of one tenant ("").

A request whose promised time (`WorkItem.due`) will have passed by the time the batch being formed
is answered has its next sentence put before every other, one a batch.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    cost: int  # sub-words
    tag: int
    request: int
    tenant: str
    due: float
    enqueued: float


T = TypeVar("T", bound=Queued)


@dataclass
class TenantFlow(Generic[T]):
    weight: float = 1.0
    items: list[T] = field(default_factory=list)  # by tag, then arrival
    round: int = 0  # the tag of the oldest sentence of its last batch
    virtual: float = 0.0  # sentences run ÷ weight, from where it last started waiting
    tokens: int = 0  # sub-words queued


# a sentence's round, read in C by the bisections (a Python function here is called ~log2(n) times
# for every request the engine admits)
_tag = operator.attrgetter("tag")


class FairQueue(Generic[T]):
    def __init__(self, weight: Callable[[str], float] = lambda tenant: 1.0, quantum: int = 1) -> None:
        self.weight = weight
        self.quantum = quantum  # sentences of a request a round
        self._flows: dict[str, TenantFlow[T]] = {}
        self._virtual = 0.0  # where the last batch's sentences started, in virtual time
        self._count = 0
        self.tokens = 0  # sub-words queued

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[T]:
        for flow in self._flows.values():
            yield from flow.items

    def _flow(self, tenant: str) -> TenantFlow[T]:
        flow = self._flows.get(tenant)
        if flow is None:
            flow = self._flows[tenant] = TenantFlow[T](weight=self.weight(tenant), virtual=self._virtual)
        elif not flow.items:  # starts waiting: at the system's virtual time, not before
            flow.virtual = max(flow.virtual, self._virtual)
        return flow

    def next_tag(self, tenant: str) -> int:
        """The tag a newcomer's first sentence gets: its tenant's current round."""
        flow = self._flows.get(tenant)
        return flow.round if flow is not None else 0

    def tag(self, first: int, index: int) -> int:
        """The tag of a request's INDEX-th sentence, its first tagged FIRST."""
        return first + index // self.quantum

    def push(self, items: Iterable[T]) -> None:
        for item in items:
            flow = self._flow(item.tenant)
            bisect.insort_right(flow.items, item, key=_tag)  # after the items of its round already queued
            flow.tokens += item.cost
            self.tokens += item.cost
            self._count += 1

    def ahead_of(self, tenant: str, sentences: int) -> int:
        """Sub-words that run before the last of a newcomer's `sentences` (its own excluded): its
        tenant's sentences tagged before its last one or with it, and what the other tenants run
        meanwhile in proportion to their weights."""
        flow = self._flows.get(tenant)
        weight = flow.weight if flow is not None else self.weight(tenant)
        if flow is None or not flow.items:
            own_ahead, own_tokens, start = 0, 0, self._virtual
        else:
            own_ahead = bisect.bisect_right(flow.items, self.tag(flow.round, max(sentences, 1) - 1), key=_tag)
            whole = own_ahead == len(flow.items)
            own_tokens = flow.tokens if whole else sum(item.cost for item in flow.items[:own_ahead])
            start = flow.virtual
        finish = start + (own_ahead + sentences) / weight
        others = 0
        for name, other in self._flows.items():
            if name == tenant or not other.items:
                continue
            runs = min(len(other.items), max(int((finish - other.virtual) * other.weight), 0))
            others += other.tokens if runs == len(other.items) else sum(item.cost for item in other.items[:runs])
        return own_tokens + others

    def order(self, limit: int, answered_by: float) -> list[T]:
        """The next `limit` sentences in the order batches take them: the next sentence of each
        request due by ANSWERED_BY, when the batch would be answered, first (the earliest due
        first), then tenants by virtual time, each tenant's sentences by tag."""
        overdue: dict[int, T] = {}
        for item in self:
            if item.due <= answered_by and item.request not in overdue:
                overdue[item.request] = item
        first = sorted(overdue.values(), key=lambda item: item.due)[:limit]
        promoted = {id(item) for item in first}
        heap = [(flow.virtual, index, name) for index, (name, flow) in enumerate(self._flows.items()) if flow.items]
        heapq.heapify(heap)
        position = {name: 0 for name in self._flows}
        ordered: list[T] = list(first)
        while heap and len(ordered) < limit:
            virtual, index, name = heapq.heappop(heap)
            flow = self._flows[name]
            at = position[name]
            while at < len(flow.items) and id(flow.items[at]) in promoted:
                at += 1
            if at == len(flow.items):
                continue
            ordered.append(flow.items[at])
            position[name] = at + 1
            heapq.heappush(heap, (virtual + 1 / flow.weight, index, name))
        return ordered

    def take(self, batch: list[T]) -> None:
        """Remove a batch's sentences: each tenant's round moves to its batch's oldest tag, its
        virtual time by what it ran."""
        chosen = {id(item) for item in batch}
        touched = {item.tenant for item in batch}
        started: list[float] = []  # where each tenant's run in this batch started, in virtual time
        for tenant in touched:
            flow = self._flows[tenant]
            mine = [item for item in flow.items if id(item) in chosen]
            flow.round = max(flow.round, flow.items[0].tag)
            started.append(flow.virtual)
            flow.virtual += len(mine) / flow.weight
            flow.items = [item for item in flow.items if id(item) not in chosen]
            flow.tokens -= sum(item.cost for item in mine)
        taken = sum(item.cost for item in batch)
        self.tokens -= taken
        self._count -= len(batch)
        # the system's virtual time is the start of what ran last (start-time fair queueing): a
        # tenant that starts waiting now starts there, before a backlogged tenant's next sentence
        # (which starts where its last one ended), and so is in the next batch
        if started:
            self._virtual = max(self._virtual, min(started))

    def remove_if(self, gone: Callable[[T], bool]) -> list[T]:
        """Drop the sentences `gone` picks (a client that went away, a deadline passed)."""
        removed: list[T] = []
        for flow in self._flows.values():
            kept: list[T] = []
            out: list[T] = []
            for item in flow.items:
                (out if gone(item) else kept).append(item)
            if out:
                flow.items = kept
                flow.tokens -= sum(item.cost for item in out)
                removed.extend(out)
        self.tokens -= sum(item.cost for item in removed)
        self._count -= len(removed)
        return removed

    def oldest_arrival(self) -> float:
        return min((flow.items[0].enqueued for flow in self._flows.values() if flow.items), default=0.0)

    def clear(self) -> list[T]:
        everything = list(self)
        for flow in self._flows.values():
            flow.items, flow.tokens = [], 0
        self.tokens = self._count = 0
        return everything
