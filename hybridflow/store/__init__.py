"""The workdir: dataset versions and their atomic publishing, run records, the pipeline's lock, and the
workdir kept in object storage."""
