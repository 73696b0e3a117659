#include "routing/plan_io.h"

#include "routing/json_reader.h"
#include "routing/json_text.h"

namespace wsync {

using nlohmann::json;

namespace {

constexpr char kPlanSchema[] = "wsync.plan/v1";

json BoxArray(const Box& b, bool sizes) {
  json a = json::array();
  for (int d = 0; d < b.ndim; ++d) a.push_back(sizes ? b.size[d] : b.offset[d]);
  return a;
}

json EndpointsJson(const std::vector<Endpoint>& eps) {
  json a = json::array();
  for (const Endpoint& e : eps) a.push_back({{"host", e.host}, {"gpu", e.gpu}, {"nic", e.nic}});
  return a;
}

Status EndpointsFromJson(const json* a, const std::string& where, std::vector<Endpoint>* out) {
  if (!a) return Status::Ok();
  for (size_t i = 0; i < a->size(); ++i) {
    JsonObjectReader r((*a)[i], where + "[" + std::to_string(i) + "]");
    Endpoint e;
    r.Str("host", &e.host);
    r.Int32("gpu", &e.gpu);
    r.Int32("nic", &e.nic);
    WSYNC_RETURN_IF_ERROR(r.Finish());
    out->push_back(std::move(e));
  }
  return Status::Ok();
}

bool ReadInt(const json& v, int64_t* out) {
  if (!v.is_number_integer()) return false;
  *out = v.get<int64_t>();
  return true;
}

// Everything of PlanToJson but the ops.
json PlanHeadJson(const RoutingTable& table) {
  json groups = json::array();
  for (const MeshGroupInfo& g : table.mesh_groups) groups.push_back({{"name", g.name}, {"ranks", g.ranks}});
  json sources = json::array();
  for (const SourceTensor& s : table.sources)
    sources.push_back({{"name", s.name}, {"global_shape", s.global_shape},
                       {"dtype", std::string(DTypeName(s.dtype))}, {"mesh_group", s.mesh_group}});
  json dests = json::array();
  for (const DestTensor& d : table.destinations) {
    json j = {{"rank", d.rank}, {"name", d.name}, {"shape", d.shape},
              {"dtype", std::string(DTypeName(d.dtype))}, {"region", d.where.region},
              {"offset", d.where.offset}, {"bytes", d.bytes}};
    if (d.has_scale)
      j["scale"] = {{"name", d.scale_name}, {"shape", d.scale_shape}, {"region", d.scale_where.region},
                    {"offset", d.scale_where.offset}, {"bytes", d.scale_bytes}};
    dests.push_back(std::move(j));
  }
  return {{"schema", kPlanSchema},
          {"mesh_groups", std::move(groups)},
          {"sources", std::move(sources)},
          {"destinations", std::move(dests)},
          {"trainer_endpoints", EndpointsJson(table.trainer_endpoints)},
          {"inference_endpoints", EndpointsJson(table.inference_endpoints)}};
}

// [mesh_group, src_rank, src, dst_rank, dst, kind, offsets, sizes,
// dst_offset, bytes], and for a strided op [..., planes, plane_dim,
// plane_stride] (plans without them read as before).
json OpJson(const WriteOp& op) {
  json a = json::array({op.mesh_group, op.src_rank, op.src, op.dst_rank, op.dst,
                        op.kind == WriteKind::kScale ? "s" : "w", BoxArray(op.src_box, false),
                        BoxArray(op.src_box, true), op.dst_offset, op.bytes});
  if (op.planes > 1) {
    a.push_back(op.planes);
    a.push_back(op.plane_dim);
    a.push_back(op.plane_stride);
  }
  return a;
}

// OpJson(op).dump(), appended.
void AppendOp(std::string* out, const WriteOp& op) {
  *out += '[';
  for (int64_t v : {int64_t{op.mesh_group}, int64_t{op.src_rank}, int64_t{op.src}, int64_t{op.dst_rank},
                    int64_t{op.dst}}) {
    AppendJsonInt(out, v);
    *out += ',';
  }
  *out += op.kind == WriteKind::kScale ? "\"s\"," : "\"w\",";
  for (bool sizes : {false, true}) {
    *out += '[';
    for (int d = 0; d < op.src_box.ndim; ++d) {
      if (d > 0) *out += ',';
      AppendJsonInt(out, sizes ? op.src_box.size[d] : op.src_box.offset[d]);
    }
    *out += "],";
  }
  AppendJsonInt(out, op.dst_offset);
  *out += ',';
  AppendJsonInt(out, op.bytes);
  if (op.planes > 1) {
    for (int64_t v : {int64_t{op.planes}, int64_t{op.plane_dim}}) {
      *out += ',';
      AppendJsonInt(out, v);
    }
    *out += ',';
    AppendJsonInt(out, op.plane_stride);
  }
  *out += ']';
}

}  // namespace

json PlanToJson(const RoutingTable& table) {
  json j = PlanHeadJson(table);
  json ops = json::array();
  for (const WriteOp& op : table.ops) ops.push_back(OpJson(op));
  j["ops"] = std::move(ops);
  return j;
}

std::string PlanToText(const RoutingTable& table) {
  // PlanToJson(table).dump() in one buffer, keys sorted as dump() sorts
  // them: a Kimi-K2 plan has 200k destinations and ~1M ops, and as trees
  // they cost most of the controller's planning pass.
  auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  std::string out;
  out.reserve(256 + table.ops.size() * 72 + table.destinations.size() * 160 + table.sources.size() * 96);
  out += "{\"destinations\":[";
  for (size_t i = 0; i < table.destinations.size(); ++i) {
    const DestTensor& d = table.destinations[i];
    if (i > 0) out += ',';
    out += "{\"bytes\":";
    AppendJsonInt(&out, d.bytes);
    out += ",\"dtype\":";
    AppendJsonString(&out, DTypeName(d.dtype));
    out += ",\"name\":";
    AppendJsonString(&out, d.name);
    out += ",\"offset\":";
    AppendJsonInt(&out, d.where.offset);
    out += ",\"rank\":";
    AppendJsonInt(&out, d.rank);
    out += ",\"region\":";
    AppendJsonString(&out, d.where.region);
    if (d.has_scale) {
      out += ",\"scale\":{\"bytes\":";
      AppendJsonInt(&out, d.scale_bytes);
      out += ",\"name\":";
      AppendJsonString(&out, d.scale_name);
      out += ",\"offset\":";
      AppendJsonInt(&out, d.scale_where.offset);
      out += ",\"region\":";
      AppendJsonString(&out, d.scale_where.region);
      out += ",\"shape\":";
      AppendJsonIntArray(&out, d.scale_shape);
      out += '}';
    }
    out += ",\"shape\":";
    AppendJsonIntArray(&out, d.shape);
    out += '}';
  }
  out += "],\"inference_endpoints\":";
  out += dump(EndpointsJson(table.inference_endpoints));
  out += ",\"mesh_groups\":[";
  for (size_t i = 0; i < table.mesh_groups.size(); ++i) {
    if (i > 0) out += ',';
    out += "{\"name\":";
    AppendJsonString(&out, table.mesh_groups[i].name);
    out += ",\"ranks\":";
    AppendJsonIntArray(&out, table.mesh_groups[i].ranks);
    out += '}';
  }
  out += "],\"ops\":[";
  for (size_t i = 0; i < table.ops.size(); ++i) {
    if (i > 0) out += ',';
    AppendOp(&out, table.ops[i]);
  }
  out += "],\"schema\":";
  AppendJsonString(&out, kPlanSchema);
  out += ",\"sources\":[";
  for (size_t i = 0; i < table.sources.size(); ++i) {
    const SourceTensor& st = table.sources[i];
    if (i > 0) out += ',';
    out += "{\"dtype\":";
    AppendJsonString(&out, DTypeName(st.dtype));
    out += ",\"global_shape\":";
    AppendJsonIntArray(&out, st.global_shape);
    out += ",\"mesh_group\":";
    AppendJsonInt(&out, st.mesh_group);
    out += ",\"name\":";
    AppendJsonString(&out, st.name);
    out += '}';
  }
  out += "],\"trainer_endpoints\":";
  out += dump(EndpointsJson(table.trainer_endpoints));
  out += '}';
  return out;
}

StatusOr<RoutingTable> PlanFromJson(const json& j, const std::string& source) {
  RoutingTable t;
  JsonObjectReader r(j, source);
  std::string schema;
  if (r.Str("schema", &schema) && schema != kPlanSchema)
    r.Fail("schema is '" + schema + "', expected '" + kPlanSchema + "'");
  const json* groups = r.Array("mesh_groups");
  const json* sources = r.Array("sources");
  const json* dests = r.Array("destinations");
  const json* ops = r.Array("ops");
  const json* tep = r.Array("trainer_endpoints", false);
  const json* iep = r.Array("inference_endpoints", false);
  WSYNC_RETURN_IF_ERROR(r.Finish());
  for (size_t i = 0; i < groups->size(); ++i) {
    JsonObjectReader g((*groups)[i], source + ": mesh_groups[" + std::to_string(i) + "]");
    MeshGroupInfo info;
    std::vector<int64_t> ranks;
    g.Str("name", &info.name);
    g.IntArray("ranks", &ranks);
    WSYNC_RETURN_IF_ERROR(g.Finish());
    info.ranks.assign(ranks.begin(), ranks.end());
    t.mesh_groups.push_back(std::move(info));
  }
  for (size_t i = 0; i < sources->size(); ++i) {
    JsonObjectReader s((*sources)[i], source + ": sources[" + std::to_string(i) + "]");
    SourceTensor st;
    s.Str("name", &st.name);
    s.IntArray("global_shape", &st.global_shape);
    s.Dtype("dtype", &st.dtype);
    s.Int32("mesh_group", &st.mesh_group);
    WSYNC_RETURN_IF_ERROR(s.Finish());
    t.sources.push_back(std::move(st));
  }
  for (size_t i = 0; i < dests->size(); ++i) {
    JsonObjectReader d((*dests)[i], source + ": destinations[" + std::to_string(i) + "]");
    DestTensor dt;
    d.Int32("rank", &dt.rank);
    d.Str("name", &dt.name);
    d.IntArray("shape", &dt.shape);
    d.Dtype("dtype", &dt.dtype);
    d.Str("region", &dt.where.region);
    d.Uint("offset", &dt.where.offset);
    d.Uint("bytes", &dt.bytes);
    if (const json* sc = d.Object("scale", false)) {
      JsonObjectReader s(*sc, d.where() + ": scale");
      dt.has_scale = true;
      s.Str("name", &dt.scale_name);
      s.IntArray("shape", &dt.scale_shape);
      s.Str("region", &dt.scale_where.region);
      s.Uint("offset", &dt.scale_where.offset);
      s.Uint("bytes", &dt.scale_bytes);
      WSYNC_RETURN_IF_ERROR(s.Finish());
    }
    WSYNC_RETURN_IF_ERROR(d.Finish());
    t.destinations.push_back(std::move(dt));
  }
  t.ops.reserve(ops->size());
  for (size_t i = 0; i < ops->size(); ++i) {
    const json& a = (*ops)[i];
    const std::string where = source + ": ops[" + std::to_string(i) + "]";
    if (!a.is_array() || (a.size() != 10 && a.size() != 13) || !a[5].is_string() || !a[6].is_array() || !a[7].is_array() ||
        a[6].size() != a[7].size() || a[6].size() > static_cast<size_t>(kMaxDims))
      return InvalidArgument(where + ": expected [mesh_group, src_rank, src, dst_rank, dst, \"w\"|\"s\", "
                             "[offsets], [sizes], dst_offset, bytes] or that and [planes, plane_dim, plane_stride]");
    WriteOp op;
    int64_t v[5];
    for (int k = 0; k < 5; ++k)
      if (!ReadInt(a[k], &v[k])) return InvalidArgument(where + ": field " + std::to_string(k) + " is not an integer");
    op.mesh_group = static_cast<int32_t>(v[0]);
    op.src_rank = static_cast<int32_t>(v[1]);
    op.src = static_cast<int32_t>(v[2]);
    op.dst_rank = static_cast<int32_t>(v[3]);
    op.dst = static_cast<int32_t>(v[4]);
    const std::string kind = a[5].get<std::string>();
    if (kind != "w" && kind != "s") return InvalidArgument(where + ": kind '" + kind + "' is not \"w\" or \"s\"");
    op.kind = kind == "s" ? WriteKind::kScale : WriteKind::kWeight;
    op.src_box.ndim = static_cast<int8_t>(a[6].size());
    for (size_t d = 0; d < a[6].size(); ++d)
      if (!ReadInt(a[6][d], &op.src_box.offset[d]) || !ReadInt(a[7][d], &op.src_box.size[d]))
        return InvalidArgument(where + ": box entries must be integers");
    if (!a[8].is_number_unsigned() || !a[9].is_number_unsigned())
      return InvalidArgument(where + ": dst_offset and bytes must be non-negative integers");
    op.dst_offset = a[8].get<uint64_t>();
    op.bytes = a[9].get<uint64_t>();
    if (a.size() == 13) {
      auto non_negative = [](const json& v, uint64_t* out) {
        if (v.is_number_unsigned()) *out = v.get<uint64_t>();
        else if (v.is_number_integer() && v.get<int64_t>() >= 0) *out = static_cast<uint64_t>(v.get<int64_t>());
        else return false;
        return true;
      };
      int64_t plane_dim = 0;
      uint64_t planes = 0, stride = 0;
      if (!non_negative(a[10], &planes) || !ReadInt(a[11], &plane_dim) || !non_negative(a[12], &stride))
        return InvalidArgument(where + ": planes, plane_dim and plane_stride must be integers");
      const std::string bad = StridedWriteError(planes, plane_dim, stride, op.bytes, &op.src_box);
      if (!bad.empty()) return InvalidArgument(where + ": " + bad);
      op.planes = static_cast<uint32_t>(planes);
      op.plane_dim = static_cast<int32_t>(plane_dim);
      op.plane_stride = stride;
    }
    t.ops.push_back(op);
  }
  WSYNC_RETURN_IF_ERROR(EndpointsFromJson(tep, source + ": trainer_endpoints", &t.trainer_endpoints));
  WSYNC_RETURN_IF_ERROR(EndpointsFromJson(iep, source + ": inference_endpoints", &t.inference_endpoints));
  return t;
}

Status WritePlanFile(const RoutingTable& table, const std::string& path) {
  return WriteTextFileAtomic(PlanToText(table) + "\n", path);
}

}  // namespace wsync
