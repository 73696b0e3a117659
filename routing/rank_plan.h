// One rank's share of the routing table, self-contained, as the controller
// hands it to an agent (JSON over HTTP) and the agent executes it.
//
// A trainer rank gets every source tensor of every MeshGroup it belongs to
// (it must take part in each all-gather even where it writes nothing), with
// the all-gather group for it and the writes it issues; an inference rank
// gets the sizes of the writes it will receive, from which it computes how
// many immediates one version produces.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "routing/metadata.h"
#include "routing/routing_table.h"

namespace wsync {

// One WriteOp, resolved to where its bytes land in the receiver's memory;
// strided like its op where planes > 1 (ExpandPlanes makes them plain).
struct RankWrite {
  int32_t dst_rank = -1;
  WriteKind kind = WriteKind::kWeight;
  DType dst_dtype = DType::kBF16;  // fp32 for kScale
  Box src_box;                     // source element grid, or block grid for kScale
  std::string region;              // region id on dst_rank
  uint64_t region_offset = 0;      // bytes from the region start
  uint64_t bytes = 0;              // of all planes
  std::string dst_name;            // engine tensor name, for error messages
  uint32_t planes = 1;
  int32_t plane_dim = -1;          // source dim, as WriteOp::plane_dim
  uint64_t plane_stride = 0;
};

// Rows [offset, offset + size) of one tensor dim.
struct Rows {
  int64_t offset = 0;
  int64_t size = 0;
  bool operator==(const Rows&) const = default;
};

struct RankSource {
  std::string name;
  Shape global_shape;
  DType dtype = DType::kBF16;
  Box local;                         // this rank's shard before unshard
  Box held;                          // what it holds after unshard
  int32_t gather_dim = -1;           // tensor dim all-gathered; -1: nothing to gather
  std::vector<int32_t> gather_ranks; // the all-gather group, in chunk order
  int64_t block_rows = 128;          // fp8 block size, for kScale writes and quantize
  int64_t block_cols = 128;
  // Planned exchange in place of the all-gather: per gather rank i (same
  // order as gather_ranks), the rows of gather_dim this rank receives from it
  // and the rows of its own shard it sends to it (i = its own index: the rows
  // it keeps). `held` is then only the rows this rank's writes read. Empty:
  // all-gather the whole of `held`.
  std::vector<Rows> recv_rows;
  std::vector<Rows> send_rows;
  // Where the dim after gather_dim is the tensor's last (a 2-d weight's
  // columns, or stacked experts' columns), the exchange narrows it too: per
  // gather rank, the columns of the piece sent to it (its writes' columns;
  // a row-parallel TP slice needs 1/TP of every row), and `held` spans only
  // this rank's own. Empty: every piece spans the whole shard in that dim.
  std::vector<Rows> send_cols;
  std::vector<RankWrite> writes;

  bool exchange() const { return !recv_rows.empty(); }
  // The dim send_cols narrow, or -1.
  int exchange_col_dim() const { return send_cols.empty() ? -1 : gather_dim + 1; }
};

struct RankMeshGroup {
  std::string name;
  std::vector<int32_t> ranks;         // every trainer rank of the group
  std::vector<RankSource> sources;    // same order on every rank of the group
};

// What a trainer needs to reach one inference rank: its transport address
// travels inside the region descriptors.
struct InferencePeer {
  int32_t rank = -1;
  std::string host;
  std::map<std::string, std::string> region_descriptors;  // region id -> descriptor
};

struct TrainerRankPlan {
  int32_t rank = -1;
  int32_t world = 0;                  // trainer ranks
  std::vector<RankMeshGroup> groups;  // execution order, only groups with this rank
  std::vector<InferencePeer> peers;   // inference ranks this rank writes to
  uint64_t write_bytes = 0;
  uint64_t writes = 0;
};

// One write an inference rank receives: where it lands in the rank's own
// regions. The agent refuses a plan with any write outside them.
struct IncomingWrite {
  std::string region;
  uint64_t offset = 0;
  uint64_t bytes = 0;  // of all planes
  std::string tensor;  // destination tensor (its scale for scale writes)
  uint32_t planes = 1;  // strided as WriteOp where > 1
  uint64_t plane_stride = 0;
};

struct InferenceRankPlan {
  int32_t rank = -1;
  std::vector<IncomingWrite> writes;  // every write this rank receives
  uint64_t bytes = 0;
};

// `held` covers whole fp8 blocks of the tensor's last two dims: it starts on
// a block edge and ends on one or at the tensor's end.
bool WholeBlocks(const Box& held, const Shape& global, int64_t block_rows, int64_t block_cols);

// "[lo:hi, ...]" per dim, for messages.
std::string BoxText(const Box& b);

// The part of `held` that `rank`'s writes of source `src` read under a
// planned exchange (SourceTensor::needs) along `dim`; empty if it writes none.
Rows ExchangeNeedRows(const SourceTensor& src, int32_t rank, int dim, Rows held);

// Extracts rank `rank`'s plan. Fails (one line naming the tensor) if a
// source needs an all-gather this pipeline cannot do (Shard placements on two
// gathered mesh dims) or is fp8-quantized without holding whole 2-D blocks.
// `rank_ops`, when given: the indices into table.ops of exactly this rank's
// ops (src_rank == rank for a trainer, dst_rank == rank for an inference
// rank), in table order, so a caller serving every rank (the controller)
// extracts each in time of its own share instead of scanning the table.
// `list_writes` false: the writes are checked and counted (write_bytes,
// writes, peers) but RankSource::writes stays empty, which is all a plan
// summary needs (listing Kimi-K2's 18 M writes was most of its modeling).
StatusOr<TrainerRankPlan> ExtractTrainerRankPlan(const RoutingTable& table, const TrainerSpec& trainer,
                                                 const InferenceSpec& inference, int32_t rank,
                                                 const std::vector<uint32_t>* rank_ops = nullptr,
                                                 bool list_writes = true);
// Every trainer rank's plan, indexing the table's ops once. Fails like
// ExtractTrainerRankPlan, on the first rank the pipeline refuses. Without
// `writes`, each rank's unshard only (sources, held boxes, exchange rows; no
// writes and no peers): what the plan summary needs, at a fraction of the
// cost and memory of a plan with millions of writes.
StatusOr<std::vector<TrainerRankPlan>> ExtractTrainerRankPlans(const RoutingTable& table, const TrainerSpec& trainer,
                                                               const InferenceSpec& inference, bool writes = true);
// The indices into table.ops of each trainer rank's ops (src_rank), in
// table order: the `rank_ops` ExtractTrainerRankPlan takes.
std::vector<std::vector<uint32_t>> OpsByTrainer(const RoutingTable& table, size_t trainer_ranks);
InferenceRankPlan ExtractInferenceRankPlan(const RoutingTable& table, int32_t rank,
                                           const std::vector<uint32_t>* rank_ops = nullptr);

// Every strided write of the plan replaced in place by its planes, one
// plain write each: what the executor and the inference agent work from (a
// slice carries them strided: a Kimi-K2 exchange is 18 M writes as plain
// ones and 1 M as strided ones).
void ExpandPlanes(TrainerRankPlan* plan);
void ExpandPlanes(InferenceRankPlan* plan);
// The writes that arrive at the rank: its writes' planes.
uint64_t WriteCount(const InferenceRankPlan& plan);

// The bytes rank `src` receives from gather peer i while unsharding (the
// exchange's rows, or that peer's all-gather chunk), and sends to it (`mine`:
// its own index in gather_ranks). For a source with gather_dim >= 0.
uint64_t UnshardBytesFrom(const RankSource& src, int64_t i);
uint64_t UnshardBytesTo(const RankSource& src, int64_t i, int64_t mine);

// A trainer plan (wsync.trainer_rank_plan/v4) lists its distinct all-gather
// groups once, in "gather_sets", and each source names its group by index
// ("gather_set", -1 for none); ParseTrainerRankPlan expands it back into
// RankSource::gather_ranks.
nlohmann::json ToJson(const TrainerRankPlan& plan);
nlohmann::json ToJson(const InferenceRankPlan& plan);
// ToJson(plan).dump(), written as text: what the controller serves, without
// a tree of every write (routing/json_text.h).
std::string ToJsonText(const TrainerRankPlan& plan);
std::string ToJsonText(const InferenceRankPlan& plan);
StatusOr<TrainerRankPlan> ParseTrainerRankPlan(const nlohmann::json& j);
StatusOr<InferenceRankPlan> ParseInferenceRankPlan(const nlohmann::json& j);

}  // namespace wsync
