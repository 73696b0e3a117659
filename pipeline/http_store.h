// The Gloo rendezvous store hosted by the controller (`/v1/kv/...`, see
// docs/CONTROL_PLANE.md), behind the RendezvousStore interface of
// pipeline/collectives.h.
//
// Used by `wsync trainer-agent`: trainer ranks on different hosts meet at the
// controller they already talk to, so no shared filesystem is needed. The
// controller's store lives in memory and a restarted controller starts empty;
// the executor's rendezvous names carry a generation (and callers a plan id
// prefix), so ranks never read a stale address.
#pragma once

#include <memory>

#include "controller/client.h"
#include "pipeline/collectives.h"

namespace wsync {

std::unique_ptr<RendezvousStore> MakeHttpRendezvousStore(controller::ControllerClient client);

}  // namespace wsync
