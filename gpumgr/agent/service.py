"""What the two device plugins do, on the node state: `AllocationService`, composed of one part per concern.

- preferred.py: device lists (ListAndWatch) and GetPreferredAllocation;
- allocate.py: Allocate (vcuda-core takes cards for the pod it guesses; vcuda-memory IDs are capacity tokens);
- prestart.py: PreStartContainer, which learns the exact owner from the kubelet checkpoint, repairs a wrong guess and
  only then writes the container's limits and starts its vDevice server;
- settle.py: settling guesses the kubelet has named, at every GetPreferredAllocation and Allocate;
- podwrites.py: pod annotations, warning events and failing a pod that can never fit;
- release.py: freeing allocations; base.py: the shared state and reads; ports.py: what the service talks to.
The ledger, limits and vDevice servers are the node core's (gpumgr/node/).
"""

from __future__ import annotations

from gpumgr.agent.allocate import Allocating
from gpumgr.agent.preferred import Preferring
from gpumgr.agent.prestart import PreStarting


class AllocationService(Preferring, Allocating, PreStarting):
    """The device plugins' calls on the node state (see the parts above); `gpumgr/agent/daemon.py` builds one."""
