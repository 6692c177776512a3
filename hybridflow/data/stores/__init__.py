"""The object stores a workdir or an input can live in, one module each, chosen by a URI's scheme.

A store module holds what is particular to one store and nothing else: its ObjectPath subclass
(PATH), its settings (SETTINGS: made with `.of(section, environ)` from the pipeline's storage:
section over the store's standard variables), which give the store's own clients (`arrow_filesystem()`,
`fsspec_filesystem()`: what Python stages, Dask, Ray and DuckDB read and write through) and the client
whose conditional writes commit (`objects()`: the methods of objectstore.ObjectStore). How an engine
with a client of its own reaches the store (Spark's Hadoop connector, Polars' object_store) is that
engine's declaration (hybridflow.engines.spark.objectstorage, hybridflow.engines.polars). Modules are
imported when a URI of theirs is first met, so naming a store costs no client library.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Mapping, Protocol


class Settings(Protocol):
    """What a store module's SETTINGS give the code above them (S3's: stores.s3.S3Settings)."""

    endpoint: str | None  # an emulator's or a compatible store's URL; None: the cloud's own
    label: str  # the store's name where no endpoint names it ("AWS S3")
    scheme: str  # its URIs' scheme: s3, gs, az

    @classmethod
    def of(cls, section: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Settings: ...
    def adopt_checksum_policy(self) -> None: ...  # before engines start workers (they inherit the environment)
    def arrow_filesystem(self): ...  # pyarrow's filesystem: Python stages, Ray, footers, pandas
    def fsspec_filesystem(self): ...  # fsspec's: DuckDB, Dask
    def objects(self): ...  # the client of a workdir's commits: objectstore.ObjectStore's methods
    def reached(self, environ: Mapping[str, str]) -> dict[str, str]: ...  # which store, as whom (no secret)


@dataclass(frozen=True)
class StoreKind:
    scheme: str  # as URIs spell it: s3, gs, az
    module: str  # the module under data/stores/ holding PATH and SETTINGS
    misspellings: tuple[str, ...]  # schemes people write meaning this one (other tools' spellings)
    # the standard variables that decide which store a run reaches and how (never a secret's value:
    # a key file's path at most), carried into cron's runs
    variables: tuple[str, ...]

    def path_type(self) -> type:
        return self._module().PATH

    def settings_type(self) -> type:
        return self._module().SETTINGS

    def _module(self):
        return importlib.import_module(f"{__name__}.{self.module}")


KINDS = (StoreKind("s3", "s3", ("s3", "s3a", "s3n"),
                   ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE",
                    "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")),
         StoreKind("gs", "gcs", ("gs", "gcs"),
                   ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT")),
         # the account only: its key, and a connection string holding it, are secrets
         StoreKind("az", "azure", ("az", "abfs", "abfss", "wasb", "wasbs", "azure"), ("AZURE_STORAGE_ACCOUNT",)))


def variables() -> tuple[str, ...]:
    """Every store's standard variables."""
    return tuple(name for kind in KINDS for name in kind.variables)


def kind_of(uri: str) -> StoreKind | None:
    """The store an object-storage URI names (exactly spelt: 'scheme://'), or None."""
    return next((kind for kind in KINDS if uri.startswith(f"{kind.scheme}://")), None)


def meant_by(scheme: str) -> StoreKind | None:
    """The store a URI scheme spelt some other way (S3:, s3a:, gcs:) most likely means."""
    return next((kind for kind in KINDS if scheme.lower() in kind.misspellings), None)
