"""Exceptions that ``torch.compile`` hands to the caller as they are.

Dynamo wraps an exception raised by a backend in ``BackendCompilerFailed``, except those
deriving from its ``ShortenTraceback``. :func:`passthrough` builds an exception of the
requested type that also derives from it, named like that type (``ValueError``,
``torch.OutOfMemoryError``), so ``except ValueError`` and tracebacks read as usual.
"""

import functools


@functools.cache
def _passthrough_class(exc_type: type) -> type:
    from torch._dynamo.exc import ShortenTraceback  # not at module level: importing Dynamo costs ~1.5 s

    # ShortenTraceback is a RuntimeError already: for RuntimeError (and its bases) it is the only base
    bases = (ShortenTraceback,) if issubclass(ShortenTraceback, exc_type) else (exc_type, ShortenTraceback)

    class Passthrough(*bases):
        def __init__(self, message):
            exc_type.__init__(self, message)
            self.first_useful_frame = None

    Passthrough.__module__ = exc_type.__module__
    Passthrough.__name__ = Passthrough.__qualname__ = exc_type.__name__
    return Passthrough


def passthrough(exc_type: type, message: str) -> BaseException:
    """An instance of ``exc_type`` (an Exception subclass) carrying ``message`` that Dynamo
    does not wrap; a plain ``exc_type(message)`` when Dynamo cannot be imported."""
    try:
        return _passthrough_class(exc_type)(message)
    except ImportError:
        return exc_type(message)
