"""What a stage's own failure becomes: the user's exception as one line located in the user's own
file (not an engine's wrapper), a data error when the engine could not decode an input while the
stage ran, a storage error when the disk filled up. The full traceback goes to the stage's log."""

from __future__ import annotations

import contextlib
import logging
import traceback
from pathlib import Path

from ..backends.engineerrors import unwrap_error
from ..data.tables import TableSource
from ..definition.pipeline import Pipeline
from ..errors import DataError, HybridflowError, StageError, is_out_of_space, out_of_space
from .errorsite import describe_user_error
from .inputs import StageInputs
from .readerrors import input_read_failure, text_input_failure


class StageErrors:
    def __init__(self, pipeline: Pipeline, inputs: StageInputs, home: Path) -> None:
        self.pipeline, self.inputs, self.home = pipeline, inputs, home

    def of(self, exc: BaseException, log: logging.Logger, stage: str | None = None) -> HybridflowError:
        log.error("the stage raised:\n%s", "".join(traceback.format_exception(exc)))
        if is_out_of_space(exc):
            return out_of_space(self.home)
        carried = unwrap_error(exc)
        if isinstance(carried, DataError):  # hybridflow's reader in an engine's worker named a bad file
            return carried
        if stage is not None:
            inputs = {ds: self.inputs.paths(ds) for ds in self.pipeline.stages[stage].inputs}
            unreadable = text_input_failure(exc, self._text_inputs(stage)) or \
                input_read_failure(exc, inputs, self._parquet_inputs(stage, inputs))
            if unreadable is not None:
                return unreadable
        return StageError(self.pipeline.redact(describe_user_error(exc, self.pipeline.root)))

    def _parquet_inputs(self, stage: str, paths: dict[str, list[Path]]) -> list[TableSource]:
        """The stage's Parquet inputs, where to look for a damaged file the engine did not name."""
        return [TableSource(dataset, tuple(paths[dataset]), store=self.pipeline.store_of(paths[dataset][0]))
                for dataset in self.pipeline.stages[stage].inputs
                if self.pipeline.dataset(dataset).kind == "table" and self.pipeline.dataset(dataset).format == "parquet"
                and paths[dataset]]

    def _text_inputs(self, stage: str) -> list[TableSource]:
        """The stage's external CSV/JSON inputs, as the engine read them."""
        sources = []
        for dataset in self.pipeline.stages[stage].inputs:
            ds = self.pipeline.dataset(dataset)
            if self.pipeline.is_external(dataset) and ds.kind == "table" and ds.format in ("csv", "json"):
                with contextlib.suppress(HybridflowError):  # unreadable at its first block: said already
                    sources.append(self.inputs.external_source(dataset))
        return sources
