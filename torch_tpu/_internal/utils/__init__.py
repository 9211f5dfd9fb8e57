"""``torch_tpu._internal.utils``: helpers other projects import (``hardware``)."""
