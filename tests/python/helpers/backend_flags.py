"""torch.backends flags a test may set: torch.testing._internal.common_utils freezes them at import
(disable_global_flags), and a test file that imports it may run first in the same process."""

import torch

settable_backend_flags = getattr(torch.backends, "__allow_nonbracketed_mutation")
