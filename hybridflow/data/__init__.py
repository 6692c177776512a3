"""Data on disk and in object storage: paths and filesystems, the lossless Parquet contract, reading
and writing tables, footers, and content hashes."""
