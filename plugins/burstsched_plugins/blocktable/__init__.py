"""The compact core of the prefix indexes: (block, endpoint) entries in numpy arrays, walked by numba."""

from burstsched_plugins.blocktable.table import BlockTable, as_keys

__all__ = ["BlockTable", "as_keys"]
