"""The stage graph: dependency order, cycles, and selecting part of it (--only/--from/--to)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..diagnostics import did_you_mean
from ..errors import ConfigError


class Dag:
    """Stages linked by the datasets they produce and consume, in file order."""

    def __init__(self, inputs: Mapping[str, Sequence[str]], outputs: Mapping[str, Sequence[str]]) -> None:
        self.stages = list(inputs)
        self.producer = {ds: stage for stage, outs in outputs.items() for ds in outs}
        self.upstream: dict[str, list[str]] = {
            stage: sorted({self.producer[ds] for ds in inputs[stage] if ds in self.producer},
                          key=self.stages.index)
            for stage in self.stages
        }
        self.downstream: dict[str, list[str]] = {stage: [] for stage in self.stages}
        for stage, parents in self.upstream.items():
            for parent in parents:
                self.downstream[parent].append(stage)

    def find_cycle(self) -> list[str] | None:
        """One cycle as [a, b, ..., a], or None."""
        state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
        path: list[str] = []

        def visit(stage: str) -> list[str] | None:
            state[stage] = 1
            path.append(stage)
            for child in self.downstream[stage]:
                if state.get(child) == 1:
                    return path[path.index(child):] + [child]
                if child not in state and (cycle := visit(child)):
                    return cycle
            path.pop()
            state[stage] = 2
            return None

        for stage in self.stages:
            if stage not in state and (cycle := visit(stage)):
                return cycle
        return None

    def order(self, subset: Iterable[str] | None = None) -> list[str]:
        """Topological order, ties broken by file order so runs are predictable."""
        wanted = set(self.stages if subset is None else subset)
        waiting = {s: len([p for p in self.upstream[s] if p in wanted]) for s in wanted}
        ordered: list[str] = []
        ready = [s for s in self.stages if s in wanted and waiting[s] == 0]
        while ready:
            stage = ready.pop(0)
            ordered.append(stage)
            for child in self.downstream[stage]:
                if child in waiting:
                    waiting[child] -= 1
                    if waiting[child] == 0:
                        ready.append(child)
                        ready.sort(key=self.stages.index)
        if len(ordered) != len(wanted):
            raise ConfigError(f"the stages form a cycle: {' -> '.join(self.find_cycle() or [])}")
        return ordered

    def ancestors(self, stage: str) -> set[str]:
        return self._closure(stage, self.upstream)

    def descendants(self, stage: str) -> set[str]:
        return self._closure(stage, self.downstream)

    @staticmethod
    def _closure(stage: str, edges: Mapping[str, list[str]]) -> set[str]:
        seen, todo = set(), [stage]
        while todo:
            for nxt in edges[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    def select(self, only: Sequence[str] = (), start: Sequence[str] = (), end: Sequence[str] = ()) -> list[str]:
        """Stages picked by --only, --from (these and everything after) and --to (these and everything
        before), intersected when combined; all stages when nothing is given."""
        for name in (*only, *start, *end):
            if name not in self.stages:
                raise ConfigError(f"no stage named '{name}'{did_you_mean(name, self.stages)}",
                                  hint=f"stages: {', '.join(self.stages)}")
        chosen = set(self.stages)
        if only:
            chosen &= set(only)
        if start:
            chosen &= set().union(*({s} | self.descendants(s) for s in start))
        if end:
            chosen &= set().union(*({s} | self.ancestors(s) for s in end))
        return self.order(chosen)
