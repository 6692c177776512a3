"""fsspec's wrapper of pyarrow's GcsFileSystem answering to gs:// (its own name for it is "gcs"):
DuckDB hands a registered filesystem the URIs whose scheme it names. A module of its own, so that
workers unpickling it import fsspec only."""

from fsspec.implementations.arrow import ArrowFSWrapper


class GcsArrowWrapper(ArrowFSWrapper):
    protocol = ("gs", "gcs")
