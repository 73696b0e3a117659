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

// Where one part's piece on TP rank r of `size` ranks starts in the source
// and how long it is: its own chunk, or, for a part with fewer shards than
// ranks, the shard it shares with its neighbours.
ChunkPiece PartPiece(const EnginePartDef& part, int64_t size, int64_t r) {
  if (part.shards > 0 && part.shards < size) {
    return TorchChunk(part.size, part.shards, r * part.shards / size);
  }
  return TorchChunk(part.size, size, r);
}

// Block fp8 quantizes each source tensor in 128x128 blocks before fusion, so
// every cut of a source (TP chunk start) and every seam between fused parts
// must fall on a block boundary.
Status CheckFp8Cuts(const EngineTensorDef& def, const std::vector<ChunkPiece>& pieces,
                    int64_t r) {
  int64_t seam = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].offset % kBlock != 0 || (i + 1 < pieces.size() &&
                                           (seam + pieces[i].size) % kBlock != 0)) {
      return InvalidArgument(
          "inference: fp8 tensor '" + def.name + "' on TP rank " + std::to_string(r) +
          ": part " + std::to_string(i) + " is cut at " + std::to_string(pieces[i].offset) +
          " (" + std::to_string(pieces[i].size) + " long), not on a " +
          std::to_string(kBlock) + " boundary; choose a tp that keeps 128-row blocks whole, "
          "or use dtype bf16");
    }
    seam += pieces[i].size;
  }
  return Status::Ok();
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
Status BuildTpRank(const std::vector<EngineTensorDef>& defs, const InferenceLayout& l,
                   int64_t r, InferenceRank* out) {
  InferenceRank& rank = *out;
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
    // The parts' pieces on this rank, along the dim that holds them.
    std::vector<ChunkPiece> pieces;
    pieces.reserve(def.parts.size());
    for (const EnginePartDef& p : def.parts) {
      pieces.push_back(by_tp ? PartPiece(p, l.tp, r) : ChunkPiece{0, p.size});
    }
    if (by_tp) {
      t.tp = TpSlice{def.tp_dim, static_cast<int32_t>(r), l.tp};
      int64_t sum = 0;
      for (const ChunkPiece& piece : pieces) sum += piece.size;
      t.shape[def.tp_dim] = sum;
    }
    t.dtype = def.fp32 ? DType::kFP32 : (def.quantizable && fp8 ? DType::kFP8E4M3 : plain);
    if (t.dtype == DType::kFP8E4M3) WSYNC_RETURN_IF_ERROR(CheckFp8Cuts(def, pieces, r));
    t.where = {"weights", offset};
    offset = AlignUp(offset + static_cast<uint64_t>(Elements(t.shape) * DTypeSize(t.dtype)));
    if (t.dtype == DType::kFP8E4M3) {
      // One fp32 scale per 128x128 block of the last two dims (the expert
      // dim, if any, stays as is); the cuts are on block boundaries (above).
      ScaleTensor s;
      s.name = def.name + "_scale_inv";
      s.dtype = DType::kFP32;
      s.shape = t.shape;
      for (size_t k = t.shape.size() - 2; k < t.shape.size(); ++k) {
        s.shape[k] = CeilDiv(t.shape[k], kBlock);
      }
      s.where = {"weights", offset};
      offset = AlignUp(offset + static_cast<uint64_t>(Elements(s.shape) * DTypeSize(s.dtype)));
      t.scale = std::move(s);
    }
    rank.tensors.push_back(std::move(t));
  }
  rank.regions.push_back({"weights", offset, ""});
  return Status::Ok();
}

}  // namespace

Status BuildInferenceSpec(const ModelDims& d, const InferenceLayout& l, InferenceSpec* out) {
  WSYNC_RETURN_IF_ERROR(CheckLayout(d, l));
  const std::vector<EngineTensorDef> defs = EngineTensors(d);
  std::vector<InferenceRank> per_tp_rank(static_cast<size_t>(l.tp));
  for (int64_t r = 0; r < l.tp; ++r) {
    WSYNC_RETURN_IF_ERROR(BuildTpRank(defs, l, r, &per_tp_rank[r]));
  }

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
