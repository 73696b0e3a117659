// The rank-0 baseline of `wsync bench cluster`: weight sync the way most
// frameworks do it today, on the same transport (libfabric) and the same
// emulated hosts as wsync, so the two times are comparable.
//
//   phase 1 (gather): every trainer rank r != 0 RDMA-writes its local bf16
//     shards (the byte count of its shard export) into one buffer that
//     trainer rank 0 registered; rank 0 counts the arrivals (Expect on imm).
//   phase 2 (send from rank 0): rank 0 writes to every inference rank exactly
//     the bytes that rank holds (its destination bytes: the wire bytes wsync
//     writes to it). The content is the gathered bf16 bytes, not quantized
//     weights: only byte counts matter for the time, and the fuse/quantize
//     work the real thing would do on rank 0 is not charged (it favours the
//     baseline).
//
// One process per rank (`wsync bench rank0-peer`, hidden), each in its host's
// network namespace; descriptors go through files in a shared work dir (net
// namespaces share the filesystem), rounds start when the harness creates
// DIR/go-<round>, and each inference peer prints "done <round> <ns>" (its
// CLOCK_MONOTONIC time, the same clock in every namespace) once all of its
// bytes have landed. A round's time: harness go -> the last inference done.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "demo/local_sync.h"
#include "routing/metadata.h"
#include "routing/routing_table.h"

namespace wsync::demo {

// One baseline process's settings (the hidden subcommand's flags).
struct Rank0PeerOptions {
  std::string role;                      // "trainer" or "inference"
  int32_t rank = 0;
  std::string dir;
  std::string provider = "tcp;ofi_rxm";
  std::string node;                      // bind address
  std::vector<uint64_t> shard_bytes;     // per trainer rank
  std::vector<uint64_t> inference_bytes; // per inference rank
  uint64_t chunk = 4ull << 20;           // bytes per write
  int rounds = 1;
  double timeout_s = 300;
};
// Runs one peer to the end; returns the process exit status (errors on stderr).
int RunRank0Peer(const Rank0PeerOptions& options);

struct Rank0BaselineOptions {
  std::string binary;                    // wsync executable
  std::string provider = "tcp;ofi_rxm";
  std::string work_dir;
  std::vector<HostPlacement> trainers;   // per trainer rank
  std::vector<HostPlacement> inference;  // per inference rank
  std::vector<uint64_t> shard_bytes;
  std::vector<uint64_t> inference_bytes;
  int rounds = 3;                        // the first is a warm-up
  double timeout_s = 300;
};

struct Rank0BaselineResult {
  std::vector<double> round_seconds;     // every round, warm-up first
  double seconds = 0;                    // median of the rounds after the warm-up
  uint64_t gathered_bytes = 0;           // phase 1: bytes written into rank 0
  uint64_t sent_bytes = 0;               // phase 2: bytes rank 0 wrote
};

StatusOr<Rank0BaselineResult> RunRank0Baseline(const Rank0BaselineOptions& options);

// Bytes of each trainer rank's local shards (its shard export's size).
std::vector<uint64_t> TrainerShardBytes(const TrainerSpec& trainer);
// Bytes each inference rank receives per update (weights and scales).
std::vector<uint64_t> InferenceWireBytes(const RoutingTable& table, size_t inference_ranks);

}  // namespace wsync::demo
