// Inference side of the generator: vLLM weight layouts per TP rank.
//
// Inference rank r belongs to instance r / gpus_per_instance and is TP rank
// r % gpus_per_instance of it. Every tensor of a rank is packed into one
// region "weights" in engine order, 256-byte aligned, an fp8 tensor's
// weight_scale_inv right after it. Descriptors are empty (dry run).
// Expert parallel follows vLLM's linear placement: rank i of an ep group of
// E experts holds a contiguous range, the first E % ep ranks one extra.
#include <string>
#include <vector>

#include "models/architecture.h"
#include "models/layout_builders.h"

namespace wsync {
namespace {

constexpr uint64_t kAlign = 256;
constexpr int64_t kBlock = 128;  // fp8 e4m3 block size (DeepSeek-V3 format)

uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

int64_t Elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Size of one part on TP rank r of `size` ranks: its own chunk, or, for a
// part with fewer shards than ranks, the shard it shares with its neighbours.
int64_t PartSize(const EnginePartDef& part, int64_t size, int64_t r) {
  if (part.shards > 0 && part.shards < size) {
    return TorchChunk(part.size, part.shards, r * part.shards / size).size;
  }
  return TorchChunk(part.size, size, r).size;
}

Status CheckLayout(const ModelDims& d, const InferenceLayout& l) {
  auto bad = [](const std::string& m) { return InvalidArgument("inference: " + m); };
  if (l.gpus < 1 || l.gpus_per_instance < 1) return bad("gpus and gpus_per_instance must be >= 1");
  if (l.gpus % l.gpus_per_instance != 0) {
    return bad("gpus (" + std::to_string(l.gpus) + ") must be a multiple of gpus_per_instance (" +
               std::to_string(l.gpus_per_instance) + ")");
  }
  if (l.tp != l.gpus_per_instance) {
    return bad("tp (" + std::to_string(l.tp) + ") must equal gpus_per_instance (" +
               std::to_string(l.gpus_per_instance) +
               "): an instance is one TP group (no PP or DP inside it)");
  }
  if (l.ep != 1 && l.ep != l.tp) {
    return bad("ep must be 1 (experts TP-sharded) or equal tp (" + std::to_string(l.tp) +
               ", experts split over the instance), got " + std::to_string(l.ep));
  }
  if (l.ep > 1 && !d.has_experts()) {
    return bad("ep is " + std::to_string(l.ep) + " but the model has no routed experts");
  }
  if (l.gpus_per_node < 1 || l.nics_per_node < 1) {
    return bad("gpus_per_node and nics_per_node must be >= 1");
  }
  if (l.dtype == DType::kFP32) return bad("dtype must be bf16, fp16 or fp8_e4m3");
  return Status::Ok();
}

// The tensors of TP rank r (of the instance), placed in one region.
InferenceRank BuildTpRank(const std::vector<EngineTensorDef>& defs, const InferenceLayout& l,
                          int64_t r) {
  InferenceRank rank;
  rank.tensors.reserve(defs.size());
  const bool fp8 = l.dtype == DType::kFP8E4M3;
  const DType plain = fp8 ? DType::kBF16 : l.dtype;
  uint64_t offset = 0;
  for (const EngineTensorDef& def : defs) {
    InferenceTensor t;
    t.name = def.name;
    t.shape = def.shape;
    const bool by_experts = def.expert_stacked && l.ep > 1;
    const bool by_tp = def.tp_split && !by_experts && l.tp > 1;
    if (by_experts) {
      const int64_t n = def.shape[0], base = n / l.ep, rem = n % l.ep;
      const int64_t start = r * base + std::min<int64_t>(r, rem);
      const int64_t count = base + (r < rem ? 1 : 0);
      t.experts = ExpertRange{start, start + count};
      t.shape[0] = count;
    }
    // Sizes of the parts on this rank, along the dim that holds them.
    const int32_t parts_dim = def.tp_split ? def.tp_dim : 0;
    std::vector<int64_t> part_sizes;
    part_sizes.reserve(def.parts.size());
    for (const EnginePartDef& p : def.parts) {
      part_sizes.push_back(by_tp ? PartSize(p, l.tp, r) : p.size);
    }
    if (by_tp) {
      t.tp = TpSlice{def.tp_dim, static_cast<int32_t>(r), l.tp};
      int64_t sum = 0;
      for (int64_t s : part_sizes) sum += s;
      t.shape[def.tp_dim] = sum;
    }
    t.dtype = def.fp32 ? DType::kFP32 : (def.quantizable && fp8 ? DType::kFP8E4M3 : plain);
    t.where = {"weights", offset};
    offset = AlignUp(offset + static_cast<uint64_t>(Elements(t.shape) * DTypeSize(t.dtype)));
    if (t.dtype == DType::kFP8E4M3) {
      // One fp32 scale per 128x128 block of each source part (the expert
      // dim, if any, stays as is).
      ScaleTensor s;
      s.name = def.name + "_scale_inv";
      s.dtype = DType::kFP32;
      const size_t first = def.expert_stacked ? 1 : 0;
      s.shape = t.shape;
      for (size_t k = first; k < t.shape.size(); ++k) {
        if (static_cast<int32_t>(k) == parts_dim) {
          int64_t blocks = 0;
          for (int64_t ps : part_sizes) blocks += CeilDiv(ps, kBlock);
          s.shape[k] = blocks;
        } else {
          s.shape[k] = CeilDiv(t.shape[k], kBlock);
        }
      }
      s.where = {"weights", offset};
      offset = AlignUp(offset + static_cast<uint64_t>(Elements(s.shape) * DTypeSize(s.dtype)));
      t.scale = std::move(s);
    }
    rank.tensors.push_back(std::move(t));
  }
  rank.regions.push_back({"weights", offset, ""});
  return rank;
}

}  // namespace

Status BuildInferenceSpec(const ModelDims& d, const InferenceLayout& l, InferenceSpec* out) {
  WSYNC_RETURN_IF_ERROR(CheckLayout(d, l));
  const std::vector<EngineTensorDef> defs = EngineTensors(d);
  std::vector<InferenceRank> per_tp_rank;
  per_tp_rank.reserve(static_cast<size_t>(l.tp));
  for (int64_t r = 0; r < l.tp; ++r) per_tp_rank.push_back(BuildTpRank(defs, l, r));

  InferenceSpec spec;
  spec.ranks.reserve(static_cast<size_t>(l.gpus));
  for (int32_t r = 0; r < l.gpus; ++r) {
    InferenceRank rank = per_tp_rank[r % l.gpus_per_instance];
    rank.rank = r;
    rank.instance = r / l.gpus_per_instance;
    rank.host = "infer-" + std::to_string(r / l.gpus_per_node);
    rank.gpu = r % l.gpus_per_node;
    rank.nic = static_cast<int32_t>(int64_t{rank.gpu} * l.nics_per_node / l.gpus_per_node);
    spec.ranks.push_back(std::move(rank));
  }
  *out = std::move(spec);
  return Status::Ok();
}

}  // namespace wsync
