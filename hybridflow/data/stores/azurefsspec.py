"""fsspec's wrapper of pyarrow's AzureFileSystem answering to az:// (and abfs://, adlfs' name for it):
DuckDB hands a registered filesystem the URIs whose scheme it names. A module of its own, so that
workers unpickling it import fsspec only."""

from fsspec.implementations.arrow import ArrowFSWrapper


class AzureArrowWrapper(ArrowFSWrapper):
    protocol = ("az", "abfs")

    @classmethod
    def _strip_protocol(cls, path):
        # fsspec's own parsing takes az://'s container for a host name and drops it
        for scheme in cls.protocol:
            if isinstance(path, str) and path.startswith(f"{scheme}://"):
                return path[len(scheme) + 3:]
        return super()._strip_protocol(path)
