"""fsspec's wrapper of pyarrow's AzureFileSystem answering to az:// (and abfs://, adlfs' name for it):
DuckDB hands a registered filesystem the URIs whose scheme it names. A module of its own, so that
workers unpickling it import fsspec only."""

from fsspec.implementations.arrow import ArrowFSWrapper


class AzureArrowWrapper(ArrowFSWrapper):
    protocol = ("az", "abfs")
