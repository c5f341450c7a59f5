"""Imported by the chaos forkserver only: pay torch's lazy imports once, before forking.

The first optimizer construction imports ~70 modules (dynamo and friends):
1-7 s here. Replica processes forked afterwards start with them loaded, so
a restart measures the library, not torch's start-up.
"""

import torch

from tests.chaos_support import trainer  # noqa: F401

_model = torch.nn.Linear(2, 2)
torch.optim.Adam(_model.parameters()).step()
torch.nn.parallel.DistributedDataParallel  # noqa: B018 (import the module)
