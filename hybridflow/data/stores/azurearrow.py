"""pyarrow's AzureFileSystem, pickled without its key: engines ship the filesystem to their workers
(Ray's object store, Dask's scheduler), where pyarrow's own pickle would carry the account key. This
one travels as its settings and is made again from the worker's environment, as S3's and GCS's
filesystems find their credentials. A module of its own: the store module imports no pyarrow.

Its limit: an object pyarrow builds over it (a dataset, a fragment) holds pyarrow's own class, whose
pickle carries the key. hybridflow's reads ship none of those; a stage that builds a pyarrow dataset
over az:// and hands it to Ray or Dask would."""

from __future__ import annotations

import pyarrow.fs as pafs


class AzureArrowFileSystem(pafs.AzureFileSystem):
    settings = None  # the stores.azure.AzureSettings it was made from

    def __reduce__(self):
        return _made_again, (self.settings,)


def _made_again(settings):
    return settings.arrow_filesystem()
