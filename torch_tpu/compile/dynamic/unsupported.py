"""The exception of the bucketing layer: a graph (or one size of it) it cannot pad safely."""



class Unsupported(Exception):
    """The masking cannot prove a graph pad-safe; the message says why. ``syms``: the
    dynamic sizes whose padding is at fault (``None``: not known)."""

    syms: frozenset | None = None
