#include "tests/trainer_agent/update_fixture.h"

#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "pipeline/fp8.h"
#include "routing/chunking.h"
#include "routing/planner.h"
#include "routing/spec_io.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::testing {
namespace {

uint64_t Align(uint64_t n) { return (n + 255) / 256 * 256; }

std::string Hex(const std::string& raw) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

TrainerParam Param(const std::string& name, const std::string& mesh, const Shape& mesh_shape,
                   const std::vector<int64_t>& coord, std::vector<Placement> placements) {
  TrainerParam p;
  p.name = name;
  p.global_shape = TrainerShapes().at(name);
  p.dtype = DType::kBF16;
  p.mesh = mesh;
  p.placements = std::move(placements);
  p.mesh_group = mesh;
  std::vector<Range> ranges;
  LocalShard(p.global_shape, mesh_shape, coord, p.placements, &ranges);
  for (const Range& r : ranges) {
    p.local_offset.push_back(r.offset);
    p.local_shape.push_back(r.size);
  }
  return p;
}

// Inference tensor layout of one rank (same on both ranks), with offsets.
struct DestLayout {
  uint64_t embed, qk, qk_scale, norm, uneven, o, experts, experts_scale, total;
};
DestLayout Layout() {
  DestLayout l{};
  uint64_t at = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t o = at;
    at = Align(at + bytes);
    return o;
  };
  l.embed = take(256 * 128 * 2);
  l.qk = take(256 * 256);
  l.qk_scale = take(2 * 2 * 4);
  l.norm = take(300 * 4);
  l.uneven = take(200 * 65 * 2);
  l.o = take(256 * 128 * 2);
  l.experts = take(2 * 384 * 128);
  l.experts_scale = take(2 * 3 * 1 * 4);
  l.total = at + 4096;  // a tail no tensor uses: must stay untouched
  return l;
}

TrainerSpec MakeTrainerSpec() {
  TrainerSpec spec;
  spec.mesh_groups = {{"dense", "dense", {"fsdp"}}, {"experts", "experts", {"fsdp"}}};
  for (int r = 0; r < kTrainers; ++r) {
    TrainerRank rank;
    rank.rank = r;
    rank.host = "trainer-" + std::to_string(r / 2);
    rank.gpu = r % 2;
    rank.nic = r % 2;
    const std::vector<int64_t> dense_coord = {r}, expert_coord = {r / 2, r % 2};
    rank.meshes = {{"dense", {kTrainers}, {"fsdp"}, dense_coord},
                   {"experts", {2, 2}, {"fsdp", "ep"}, expert_coord}};
    for (const char* name :
         {"embed.weight", "layers.0.q.weight", "layers.0.k.weight", "norm.weight", "layers.0.o.weight"}) {
      rank.params.push_back(Param(name, "dense", {kTrainers}, dense_coord, {Placement::Shard(0)}));
    }
    rank.params.push_back(Param("uneven.weight", "dense", {kTrainers}, dense_coord, {Placement::Shard(1)}));
    rank.params.push_back(Param("layers.0.experts.w1", "experts", {2, 2}, expert_coord,
                                {Placement::Shard(1), Placement::Shard(0)}));
    spec.ranks.push_back(std::move(rank));
  }
  return spec;
}

InferenceSpec MakeInferenceSpec(const std::vector<std::string>& descriptors) {
  const DestLayout l = Layout();
  InferenceSpec spec;
  for (int r = 0; r < kInference; ++r) {
    InferenceRank rank;
    rank.rank = r;
    rank.host = "infer-0";
    rank.gpu = r;
    rank.nic = r;
    rank.regions = {{"weights", l.total, descriptors[r]}};
    auto tensor = [&](const std::string& name, Shape shape, DType dtype, uint64_t offset) {
      InferenceTensor t;
      t.name = name;
      t.shape = std::move(shape);
      t.dtype = dtype;
      t.where = {"weights", offset};
      return t;
    };
    InferenceTensor embed = tensor("embed.weight", {256, 128}, DType::kBF16, l.embed);
    embed.tp = TpSlice{0, r, 2};
    InferenceTensor qk = tensor("layers.0.qk.weight", {256, 256}, DType::kFP8E4M3, l.qk);
    qk.tp = TpSlice{0, r, 2};
    qk.scale = ScaleTensor{"layers.0.qk.weight_scale_inv", {2, 2}, DType::kFP32, {"weights", l.qk_scale}};
    InferenceTensor norm = tensor("norm.weight", {300}, DType::kFP32, l.norm);
    InferenceTensor uneven = tensor("uneven.weight", {200, 65}, DType::kBF16, l.uneven);
    uneven.tp = TpSlice{1, r, 2};
    InferenceTensor o = tensor("layers.0.o.weight", {256, 128}, DType::kBF16, l.o);  // row-parallel
    o.tp = TpSlice{1, r, 2};
    InferenceTensor experts = tensor("layers.0.experts.w1", {2, 384, 128}, DType::kFP8E4M3, l.experts);
    experts.experts = ExpertRange{2 * r, 2 * r + 2};
    experts.scale =
        ScaleTensor{"layers.0.experts.w1_scale_inv", {2, 3, 1}, DType::kFP32, {"weights", l.experts_scale}};
    rank.tensors = {embed, qk, norm, uneven, o, experts};
    spec.ranks.push_back(std::move(rank));
  }
  return spec;
}

StatusOr<MappingSpec> MakeMapping() {
  const nlohmann::json j = {
      {"schema", "wsync.mapping/v1"},
      {"name", "trainer-agent-test"},
      {"rules",
       {{{"engine", "layers.{L}.qk.weight"},
         {"concat",
          {{"dim", 0},
           {"parts", {{{"source", "layers.{L}.q.weight"}}, {{"source", "layers.{L}.k.weight"}}}}}}},
        {{"engine", "layers.{L}.experts.w1"},
         {"stack_experts", {{"parts", {{{"source", "layers.{L}.experts.w1"}, {"expert_dim", 0}}}}}}},
        {{"engine", "{*}"}, {"source", "{*}"}}}},
      {"quantize",
       {{{"dtype", "fp8_e4m3"}, {"block", {128, 128}}, {"scale_dtype", "fp32"}, {"scale_suffix", "_scale_inv"}}}}};
  return ParseMappingSpec(j, "test-mapping");
}

// ---- reference helpers: plain loops over the full tensors ----

void PutBf16Rows(const std::vector<uint16_t>& full, int64_t cols, int64_t row0, int64_t rows, uint8_t* out) {
  std::memcpy(out, full.data() + row0 * cols, static_cast<size_t>(rows * cols * 2));
}

}  // namespace

TrainerSpec MakeTestTrainerSpec() { return MakeTrainerSpec(); }

const std::map<std::string, Shape>& TrainerShapes() {
  static const std::map<std::string, Shape> shapes = {
      {"embed.weight", {512, 128}},       {"layers.0.q.weight", {256, 256}},
      {"layers.0.k.weight", {256, 256}},  {"norm.weight", {300}},
      {"uneven.weight", {200, 130}},      {"layers.0.experts.w1", {4, 384, 128}},
      {"layers.0.o.weight", {256, 256}},
  };
  return shapes;
}

StatusOr<std::unique_ptr<UpdateFixture>> MakeUpdateFixture(const std::string& provider, bool exchange,
                                                            uint64_t min_shard_piece_bytes) {
  auto f = std::make_unique<UpdateFixture>();
  f->region_bytes = Layout().total;
  std::vector<std::string> descriptors;
  for (int r = 0; r < kInference; ++r) {
    transport::fabric::LibfabricOptions o;
    o.provider = provider;
    o.num_nics = 1;
    o.node = provider == "shm" ? "" : "127.0.0.1";
    o.op_timeout = std::chrono::milliseconds(5000);
    InferenceTarget t;
    WSYNC_ASSIGN_OR_RETURN(t.engine, transport::fabric::CreateLibfabricEngine(o));
    t.memory.assign(f->region_bytes, kFill);
    WSYNC_ASSIGN_OR_RETURN(t.region, t.engine->Register(t.memory.data(), t.memory.size()));
    descriptors.push_back(Hex(t.region->descriptor().Serialize()));
    f->targets.push_back(std::move(t));
  }
  f->trainer = MakeTrainerSpec();
  f->inference = MakeInferenceSpec(descriptors);
  WSYNC_ASSIGN_OR_RETURN(f->mapping, MakeMapping());
  PlanOptions options;
  options.exchange = exchange;
  options.min_shard_piece_bytes = min_shard_piece_bytes;
  WSYNC_ASSIGN_OR_RETURN(f->table, Plan(f->trainer, f->inference, f->mapping, options));
  for (int r = 0; r < kTrainers; ++r) {
    WSYNC_ASSIGN_OR_RETURN(TrainerRankPlan plan, ExtractTrainerRankPlan(f->table, f->trainer, f->inference, r));
    f->plans.push_back(std::move(plan));
  }
  for (int r = 0; r < kInference; ++r) {
    uint32_t arrivals = 0;
    InferenceRankPlan incoming = ExtractInferenceRankPlan(f->table, r);
    ExpandPlanes(&incoming);  // arrivals are counted per write that lands: per plane
    for (const IncomingWrite& w : incoming.writes) {
      const uint64_t bytes = w.bytes;
      arrivals += f->targets[r].engine->ArrivalsPerWrite(bytes);
    }
    f->expected_arrivals.push_back(arrivals);
  }
  return f;
}

FullWeights MakeFullWeights(uint64_t version) {
  FullWeights full;
  uint64_t salt = 0;
  for (const auto& [name, shape] : TrainerShapes()) {
    ++salt;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const int64_t cols = shape.back();
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ (version * 0xBF58476D1CE4E5B9ull) ^
                   (salt << 40);
      h ^= h >> 29;
      h *= 0x94D049BB133111EBull;
      h ^= h >> 32;
      const double unit = static_cast<double>(h & 0xFFFFFF) / double(0xFFFFFF) * 2.0 - 1.0;
      // Magnitude varies per 128-block (and per version) so scales differ.
      const int64_t block = (i / cols / 128) * 7 + (i % cols) / 128 + static_cast<int64_t>(version);
      const double mag = std::ldexp(1.0, static_cast<int>(block % 9) - 4);
      v[static_cast<size_t>(i)] = Fp32ToBf16(static_cast<float>(unit * mag));
    }
    full.emplace(name, std::move(v));
  }
  return full;
}

std::vector<uint8_t> LocalShard(const TrainerParam& p, const FullWeights& full) {
  const std::vector<uint16_t>& src = full.at(p.name);
  const Shape& g = p.global_shape;
  const int n = static_cast<int>(g.size());
  int64_t count = 1;
  for (int64_t d : p.local_shape) count *= d;
  std::vector<uint8_t> out(static_cast<size_t>(count * 2));
  // Visit every local element in row-major order; index into the full tensor.
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, flat = 0, stride = 1;
    std::vector<int64_t> idx(n);
    for (int d = n - 1; d >= 0; --d) {
      idx[d] = rest % p.local_shape[d] + p.local_offset[d];
      rest /= p.local_shape[d];
    }
    for (int d = n - 1; d >= 0; --d) {
      flat += idx[d] * stride;
      stride *= g[d];
    }
    std::memcpy(out.data() + i * 2, &src[static_cast<size_t>(flat)], 2);
  }
  return out;
}

std::vector<uint8_t> ExpectedRegion(int rank, const FullWeights& full, uint64_t region_bytes) {
  const DestLayout l = Layout();
  std::vector<uint8_t> out(region_bytes, kFill);
  uint8_t* base = out.data();

  // embed: rows [256r, 256r + 256) of [512, 128].
  PutBf16Rows(full.at("embed.weight"), 128, 256 * rank, 256, base + l.embed);

  // qk = concat(q, k) on dim 0, each part split by TP: q rows [128r, +128)
  // then k rows [128r, +128); quantized per source tensor before the concat.
  for (int part = 0; part < 2; ++part) {
    const std::vector<uint16_t>& w = full.at(part == 0 ? "layers.0.q.weight" : "layers.0.k.weight");
    StatusOr<Fp8BlockTensor> q = QuantizeFp8Blocks({w.data(), 256, 256, 256});
    for (int64_t row = 0; row < 128; ++row) {
      std::memcpy(base + l.qk + (part * 128 + row) * 256, q->q.data() + (128 * rank + row) * 256, 256);
    }
    // scale grid of q (and k) is [2, 2]; this rank needs block row `rank`.
    std::memcpy(base + l.qk_scale + part * 2 * 4, q->scale_inv.data() + rank * 2, 2 * 4);
  }

  // norm: all 300 values, bf16 widened to fp32.
  const std::vector<uint16_t>& norm = full.at("norm.weight");
  for (int i = 0; i < 300; ++i) {
    const float f = Bf16ToFp32(norm[i]);
    std::memcpy(base + l.norm + i * 4, &f, 4);
  }

  // uneven: columns [65r, 65r + 65) of [200, 130].
  const std::vector<uint16_t>& un = full.at("uneven.weight");
  for (int row = 0; row < 200; ++row) {
    std::memcpy(base + l.uneven + row * 65 * 2, un.data() + row * 130 + 65 * rank, 65 * 2);
  }

  // o: columns [128r, 128r + 128) of [256, 256].
  const std::vector<uint16_t>& o = full.at("layers.0.o.weight");
  for (int row = 0; row < 256; ++row) {
    std::memcpy(base + l.o + row * 128 * 2, o.data() + row * 256 + 128 * rank, 128 * 2);
  }

  // experts [2r, 2r + 2) of [4, 384, 128], each quantized on its own.
  const std::vector<uint16_t>& ex = full.at("layers.0.experts.w1");
  for (int e = 0; e < 2; ++e) {
    const uint16_t* m = ex.data() + (2 * rank + e) * 384 * 128;
    StatusOr<Fp8BlockTensor> q = QuantizeFp8Blocks({m, 384, 128, 128});
    std::memcpy(base + l.experts + e * 384 * 128, q->q.data(), 384 * 128);
    std::memcpy(base + l.experts_scale + e * 3 * 4, q->scale_inv.data(), 3 * 4);
  }
  return out;
}

}  // namespace wsync::testing
