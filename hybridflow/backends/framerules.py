"""A rule about a frame's columns that several engines share: a pandas index kept or dropped."""

from __future__ import annotations


def index_as_columns(frame):
    """A named index is data (set_index("customer_id")) and becomes columns; an unnamed one is a row
    position left over from filtering or sorting, and is dropped. Same rule for pandas and Dask."""
    names = getattr(frame.index, "names", None) or [frame.index.name]  # a Dask Index has only .name
    if any(name is not None for name in names):
        return frame.reset_index()
    return frame
