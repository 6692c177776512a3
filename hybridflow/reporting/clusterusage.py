"""What each cluster brought up for a run cost, from the run's timeline: the seconds it took to bring up
and to take down, the seconds a stage of its engine ran on it (busy) and the rest of its life (idle),
and its node-seconds: its hosts times its whole life, up to down, which is what a cloud bill counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .timeline import ATTEMPT, CLUSTER_DOWN, CLUSTER_UP

# the columns of the table of them, in the report and in `hybridflow show`
COLUMNS = ("cluster", "nodes", "bring up", "busy", "idle", "take down", "node-seconds", "ended")


@dataclass(frozen=True)
class ClusterUsage:
    engine: str
    nodes: int | None  # None: its `up` said neither its hosts nor how many nodes
    up: float  # seconds bringing it up
    busy: float  # seconds, while it was up, that a stage of its engine was running
    idle: float  # seconds it was up with no stage of its engine running
    down: float | None  # seconds taking it down; None: the run recorded no teardown (it was killed)
    outcome: str  # how it ended: ok, failed (up or down failed) or stopped

    @property
    def node_seconds(self) -> float | None:
        if self.nodes is None or self.down is None:
            return None
        return self.nodes * (self.up + self.busy + self.idle + self.down)


def cluster_usage(spans: Iterable[dict[str, Any]], stages: Iterable[dict[str, Any]]) -> list[ClusterUsage]:
    """Each cluster of a run (an engine's cluster brought up twice counts twice), in the order they came up."""
    spans = sorted(spans, key=lambda s: s["started_at"])
    backend_of = {s["stage"]: s["backend"] for s in stages}
    end_of_run = max([s["ended_at"] or s["started_at"] for s in spans], default=0.0)
    found = []
    for index, up in enumerate(spans):
        if up["kind"] != CLUSTER_UP:
            continue
        engine, ready = up["detail"], up["ended_at"] or up["started_at"]
        down = next((s for s in spans[index + 1:] if s["kind"] == CLUSTER_DOWN and s["detail"] == engine), None)
        # a cluster whose up failed was taken down inside the up's own span: it never was up
        until = max(ready, down["started_at"]) if down else end_of_run
        runs = [(s["started_at"], s["ended_at"] or end_of_run) for s in spans
                if s["kind"] == ATTEMPT and backend_of.get(s["stage"]) == engine]
        busy = _covered(runs, ready, until) if up["outcome"] == "ok" else 0.0
        outcome = up["outcome"] if up["outcome"] != "ok" or down is None else down["outcome"]
        found.append(ClusterUsage(engine, up.get("nodes"), ready - up["started_at"], busy,
                                  max(0.0, until - ready - busy) if up["outcome"] == "ok" else 0.0,
                                  (down["ended_at"] or down["started_at"]) - down["started_at"] if down else None,
                                  outcome))
    return found


def _covered(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] inside at least one of `intervals` (stages of one engine may overlap)."""
    total, reach = 0.0, start
    for begin, finish in sorted(intervals):
        begin, finish = max(begin, reach), min(finish, end)
        if finish > begin:
            total += finish - begin
            reach = finish
    return total
