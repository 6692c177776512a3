"""What the two ways of bringing a cluster up for a run (provisioning's commands, sshclusters' hosts)
share: the variable every process of a cluster carries, and how one of their commands ended."""

from __future__ import annotations

from dataclasses import dataclass

TAG = "HYBRIDFLOW_CLUSTER_NAME"  # hf-<pipeline>-<run>-<engine> in every process a cluster's commands start


@dataclass
class Outcome:
    returncode: int | None  # None: killed at its timeout
    output: str


def ended(outcome: Outcome) -> str:
    return "timed out" if outcome.returncode is None else f"exited {outcome.returncode}"
