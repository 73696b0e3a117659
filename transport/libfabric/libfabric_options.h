// Settings of the libfabric backend, chosen once at engine creation (never
// per call). Read by fabric_info (provider choice), domain_group (threads,
// splitting, timeouts) and the bench/tests that build engines.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace wsync::transport::fabric {

struct LibfabricOptions {
  // Provider by libfabric name: "efa", "verbs;ofi_rxm", "tcp;ofi_rxm", "shm".
  std::string provider = "shm";
  // Endpoints opened, one per NIC. On machines without several NICs, several
  // endpoints of one provider stand in for them.
  uint32_t num_nics = 1;
  // Local address to bind (passed to fi_getinfo with FI_SOURCE), e.g. the
  // IP of the interface for tcp. Empty: the provider's default.
  std::string node;
  // Ask for FI_HMEM (needed to register CUDA memory).
  bool enable_hmem = false;
  // Pin the worker to a core near this GPU (hwloc); if the GPU is not found
  // (or gpu < 0) pin to `core` when core >= 0; otherwise do not pin.
  int gpu = -1;
  int core = -1;
  // The GPU's PCI bus id ("0000:18:00.0", e.g. from cudaDeviceGetPCIBusId):
  // found by hwloc's PCI discovery even where its CUDA/NVML plugins are
  // missing. Preferred over `gpu` when set.
  std::string gpu_pci_bus_id;
  // Runs first on the engine's worker thread, the one that progresses the
  // endpoints, e.g. to make a CUDA context current there: libfabric's CUDA
  // calls (IPC handles, device copies) run on the thread that progresses.
  std::function<void()> on_worker_start;
  // A SingleWrite at least this large is split evenly across all NICs.
  // Below it one NIC finishes sooner than splitting (measured: see
  // docs/transport.md).
  uint64_t split_threshold = 4ull << 20;
  // A request whose operations have not all completed by then fails with
  // DEADLINE_EXCEEDED (the peer is dead or unreachable); bounds every wait.
  std::chrono::milliseconds op_timeout{30000};
  // Pages gathered into one write operation (capped by the provider's
  // iov_limit and rma_iov_limit). Measured on shm 1.17 (1 MiB of 16 KiB
  // pages): 1 per op 6.0 GB/s, 4 per op 0.7 GB/s (multi-iov RMA leaves
  // shm's fast path), so 1 by default. Must match on all peers: it sets how
  // many immediates a paged write delivers.
  uint32_t max_pages_per_op = 1;
  // After this long with nothing to do the worker sleeps in short naps of
  // `idle_nap` (a submit wakes it at once; remote arrivals wait <= one nap).
  // Zero idle_after keeps it spinning (benchmarks).
  std::chrono::microseconds idle_after{2000};
  std::chrono::microseconds idle_nap{200};
  // Operations posted and not yet completed, per NIC. Above it requests
  // wait in the partly-posted list (back-pressure, like FI_EAGAIN).
  uint32_t max_inflight_per_nic = 256;
  // Bytes posted and not yet completed, per NIC (one operation may always
  // go). Measured on shm: far more than this in flight collapses throughput
  // (64 x 4 MiB outstanding: 2.8 GB/s; capped at 16 MiB: 14 GB/s).
  uint64_t max_inflight_bytes_per_nic = 16ull << 20;
  // The same for operations from CUDA memory, counted apart: the provider
  // moves them without host bounce buffers (shm maps the source by CUDA IPC,
  // a NIC reads it by DMA), so depth is what keeps the copy engines busy.
  // Measured on an H200 (shm, libfabric 2.7, 16 MiB writes): capped by the
  // host figure, one write at a time, 258 GB/s; fi_rma_bw 64 deep, 985 GB/s.
  uint64_t max_inflight_cuda_bytes_per_nic = 4ull << 30;
};

}  // namespace wsync::transport::fabric
