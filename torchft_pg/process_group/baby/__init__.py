"""Baby process groups: the real backend runs in a child process.

This package's ``__init__`` is its public face: the names below are all that
code outside it imports. Its modules are named by the side of the process
boundary they run on:

- the parent (the training process, which constructs the group):

  - `group`: `ProcessGroupBaby` and its Gloo/NCCL/XCCL classes, the groups a
    user builds;
  - `parent`: the parent's handle on one child (`ChildProcess`): its process,
    its socket, and who reads the child's replies;
  - `pending`: the requests sent to the child that await a reply;

- the child (the subprocess that builds and runs the real backend):

  - `child`: its command loop, started as
    ``python -m torchft_pg.process_group.baby.child`` or forked by a zygote;

- shared by both ends of the socket:

  - `messages`: the typed messages and their framing;
  - `protocol`: how an op's tensors and options cross (encoded by the parent,
    decoded by the child);

- the zygote (a pre-started interpreter that forks children):

  - `zygote`: the parent's handle on it (`Zygote`, `ForkedProcess`) and the
    zygote's own loop (`zygote_main`, run through ``baby.child zygote``).
"""

from torchft_pg.process_group.baby.group import (
    ProcessGroupBaby,
    ProcessGroupBabyGloo,
    ProcessGroupBabyNCCL,
    ProcessGroupBabyXCCL,
    ProcessGroupShutdownError,
)

__all__ = [
    "ProcessGroupBaby",
    "ProcessGroupBabyGloo",
    "ProcessGroupBabyNCCL",
    "ProcessGroupBabyXCCL",
    "ProcessGroupShutdownError",
]
