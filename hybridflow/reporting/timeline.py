"""A run's wall-clock timeline: when each engine started and stopped, and, for every attempt of every
stage, when it read its inputs, ran the user's function, published, and waited before a retry.
Recorded in runs.db (table spans) as each step ends, so a killed run keeps what it did; `hybridflow
report` draws it."""

from __future__ import annotations

import contextlib
import logging
import time

from ..errors import StorageError
from ..store.state import RunStore

# what a span is of; the report colours and orders them by this
ENGINE_START, ENGINE_STOP = "engine start", "engine stop"
CLUSTER_UP, CLUSTER_DOWN = "cluster up", "cluster down"  # a cluster brought up for the run (provisioning)
ATTEMPT, READ, CALL, PUBLISH, RETRY_WAIT = "attempt", "read inputs", "function", "publish", "retry wait"


class Timeline:
    def __init__(self, store: RunStore | None = None, run_id: str | None = None) -> None:
        self.store, self.run_id = store, run_id

    @contextlib.contextmanager
    def span(self, kind: str, stage: str | None = None, detail: str | None = None, attempt: int | None = None):
        """Time the block; recorded when it ends, with its outcome (ok, failed or stopped). The block
        may set facts learnt inside it on what it is given: {"nodes": 3} for a cluster brought up."""
        started, outcome, facts = time.time(), "ok", {}
        try:
            yield facts
        except Exception:
            outcome = "failed"
            raise
        except BaseException:
            outcome = "stopped"
            raise
        finally:
            self._save(kind, stage, detail, attempt, started, time.time(), outcome, facts.get("nodes"))

    def _save(self, kind, stage, detail, attempt, started, ended, outcome, nodes=None) -> None:
        if self.store is None:
            return
        try:  # a timeline that cannot be written (a full disk) never fails the run
            self.store.save_span(run_id=self.run_id, stage=stage, kind=kind, detail=detail, attempt=attempt,
                                 started_at=started, ended_at=ended, outcome=outcome, nodes=nodes)
        except StorageError as exc:  # the run's own record fails on it next, and says it once
            logging.getLogger("hybridflow").debug("timeline not recorded: %s", exc)
        except Exception as exc:  # noqa: BLE001
            logging.getLogger("hybridflow").warning("timeline not recorded: %s", exc)
