#include "controller/state_store.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "routing/json_reader.h"
#include "routing/json_text.h"
#include "routing/spec_io.h"

namespace wsync::controller {

using nlohmann::json;

namespace {

constexpr char kStateSchema[] = "wsync.controller_state/v1";
constexpr char kVersionsSchema[] = "wsync.controller_versions/v1";

// The bytes of `path`: nullopt if it does not exist; refused if it is not a
// regular file (a link to /dev/zero) or holds more than `max_bytes`, which
// is also all that is ever read of it.
StatusOr<std::optional<std::string>> ReadBounded(const std::string& path, uint64_t max_bytes) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) return std::optional<std::string>();
  if (ec || st.type() != std::filesystem::file_type::regular)
    return InvalidArgument(path + ": not a regular file; the state dir is damaged, start with a fresh --state-dir");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Internal(path + ": cannot open: " + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > max_bytes)
      return InvalidArgument(path + ": over " + std::to_string(max_bytes >> 20) +
                             " MiB, more than this controller ever writes; the state dir is damaged, start with a "
                             "fresh --state-dir");
  }
  return std::optional<std::string>(std::move(text));
}

// Reads `path` as JSON; nullopt if the file does not exist.
StatusOr<std::optional<json>> ReadOptionalJson(const std::string& path, uint64_t max_bytes) {
  WSYNC_ASSIGN_OR_RETURN(std::optional<std::string> text, ReadBounded(path, max_bytes));
  if (!text) return std::optional<json>();
  StatusOr<json> j = ParseJsonText(*text, path);
  if (!j.ok())
    return InvalidArgument(j.status().message() + "; the state dir is damaged, start with a fresh --state-dir");
  return std::optional<json>(std::move(j).value());
}

// `text` and a newline; temp file + fsync + rename: readers see the old
// file or the new one. The newline written apart: appending it to an 80 MB
// plan would copy the plan.
Status WriteLineAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Internal(tmp + ": cannot open for writing: " + std::strerror(errno));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fputc('\n', f) != EOF &&
                       std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !written) {
    std::remove(tmp.c_str());
    return Internal(tmp + ": cannot write: " + std::strerror(written ? errno : write_errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(tmp.c_str());
    return Internal("cannot rename " + tmp + " to " + path + ": " + std::strerror(rename_errno));
  }
  return Status::Ok();
}

}  // namespace

std::string StateStore::Path(const char* name) const { return dir_ + "/" + name; }

Status StateStore::Init() {
  if (dir_.empty()) return Status::Ok();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return Internal("state dir " + dir_ + ": cannot create: " + ec.message());
  return Status::Ok();
}

Status StateStore::SaveWorld(const WorldToSave& world, const std::string& plan_text) {
  if (dir_.empty()) return Status::Ok();
  // world.json says versions.json is required: it exists before world.json
  // does (no version complete yet at the first plan).
  std::error_code ec;
  if (!std::filesystem::exists(Path("versions.json"), ec)) WSYNC_RETURN_IF_ERROR(SaveVersions(PersistedVersions{}));
  // The two files (~130 MB at Kimi-K2 scale) written and synced at once.
  std::future<Status> plan =
      std::async(std::launch::async, [&] { return WriteLineAtomically(Path("plan.json"), plan_text); });
  Status world_saved = SaveWorldFile(world);
  Status plan_saved = plan.get();
  return plan_saved.ok() ? world_saved : plan_saved;
}

Status StateStore::SaveWorldFile(const WorldToSave& world) const {
  const json head = {{"schema", kStateSchema},
                     {"world", {{"trainers", world.trainer_ranks}, {"inference", world.inference_ranks}}},
                     {"plan_id", world.plan_id},
                     {"epoch", world.epoch},
                     {"versions_required", true}};
  auto text = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  // Synced like plan.json: a controller restarted after a crash must not
  // find a plan without the world it was made for.
  return WriteLineAtomically(Path("world.json"),
                             ObjectTextWith(head, {{"inference", world.inference}, {"mapping", text(world.mapping)},
                                                   {"trainer", world.trainer}}));
}

StatusOr<std::optional<PersistedWorld>> StateStore::LoadWorld() const {
  if (dir_.empty()) return std::optional<PersistedWorld>();
  const std::string path = Path("world.json");
  WSYNC_ASSIGN_OR_RETURN(std::optional<json> j, ReadOptionalJson(path, kMaxWorldBytes));
  if (!j) return std::optional<PersistedWorld>();
  const json& s = *j;
  // Every type checked before a get(): json::value() throws on a mismatch.
  auto is_int32 = [](const json& w, const char* key) {
    return w.contains(key) && w[key].is_number_integer() && w[key].get<int64_t>() >= 0 &&
           w[key].get<int64_t>() <= INT32_MAX;
  };
  if (!s.is_object() || s.value("schema", json()) != kStateSchema || !s.contains("world") ||
      !s["world"].is_object() || !is_int32(s["world"], "trainers") || !is_int32(s["world"], "inference") ||
      !s.contains("trainer") || !s.contains("inference") ||
      !s.contains("mapping") || !s.value("plan_id", json()).is_string())
    return InvalidArgument(path + ": not a " + std::string(kStateSchema) +
                           " document; start with a fresh --state-dir");
  PersistedWorld w;
  w.trainer_ranks = s["world"]["trainers"].get<int32_t>();
  w.inference_ranks = s["world"]["inference"].get<int32_t>();
  w.trainer = s["trainer"];
  w.inference = s["inference"];
  w.mapping = s["mapping"];
  w.plan_id = s["plan_id"].get<std::string>();
  if (s.contains("epoch")) {  // absent in state dirs written before epochs: 1
    if (!s["epoch"].is_number_unsigned() || s["epoch"].get<uint64_t>() == 0 ||
        s["epoch"].get<uint64_t>() > kMaxEpoch)
      return InvalidArgument(path + ": 'epoch' must be an integer from 1 to 2^62; start with a fresh --state-dir");
    w.epoch = s["epoch"].get<uint64_t>();
  }
  if (s.contains("versions_required")) {
    if (!s["versions_required"].is_boolean())
      return InvalidArgument(path + ": 'versions_required' must be true or false; start with a fresh --state-dir");
    w.versions_required = s["versions_required"].get<bool>();
  }
  return std::optional<PersistedWorld>(std::move(w));
}

Status StateStore::SaveVersions(const PersistedVersions& v) {
  if (dir_.empty()) return Status::Ok();
  json j = {{"schema", kVersionsSchema},
            {"has_complete", v.has_complete},
            {"latest_complete", v.latest_complete},
            {"update_seconds", v.update_seconds},
            {"finished_unix", v.finished_unix}};
  if (v.landed != 0) j["landed"] = {{"version", v.landed}, {"committing", v.committing}};
  if (v.running != 0) j["running"] = v.running;
  return WriteJsonFile(j, Path("versions.json"), 1);
}

StatusOr<PersistedVersions> StateStore::LoadVersions() const {
  PersistedVersions v;
  if (dir_.empty()) return v;
  const std::string path = Path("versions.json");
  WSYNC_ASSIGN_OR_RETURN(std::optional<json> j, ReadOptionalJson(path, kMaxVersionsBytes));
  if (!j) return v;
  v.found = true;
  // Types checked first: json::value() throws on a mismatch.
  auto absent_or = [&](const char* key, bool (json::*is)() const noexcept) {
    return !j->contains(key) || ((*j)[key].*is)();
  };
  if (!j->is_object() || j->value("schema", json()) != kVersionsSchema ||
      !absent_or("has_complete", &json::is_boolean) || !absent_or("latest_complete", &json::is_number_unsigned) ||
      !absent_or("update_seconds", &json::is_number) || !absent_or("finished_unix", &json::is_number) ||
      !absent_or("running", &json::is_number_unsigned))
    return InvalidArgument(path + ": not a " + std::string(kVersionsSchema) +
                           " document; start with a fresh --state-dir");
  v.has_complete = j->value("has_complete", false);
  v.latest_complete = j->value("latest_complete", uint64_t{0});
  v.update_seconds = j->value("update_seconds", 0.0);
  v.finished_unix = j->value("finished_unix", 0.0);
  v.running = j->value("running", uint64_t{0});
  if (j->contains("landed")) {
    const json& l = (*j)["landed"];
    const bool ok = l.is_object() && l.value("version", json()).is_number_unsigned() &&
                    l.value("committing", json()).is_array();
    bool ranks = ok;
    if (ok)
      for (const json& r : l["committing"]) ranks = ranks && r.is_number_integer() && r.get<int64_t>() >= 0 && r.get<int64_t>() <= INT32_MAX;
    if (!ranks)
      return InvalidArgument(path + ": 'landed' must be {\"version\": N, \"committing\": [ranks]}; start with a fresh --state-dir");
    v.landed = l["version"].get<uint64_t>();
    for (const json& r : l["committing"]) v.committing.push_back(r.get<int32_t>());
  }
  return v;
}

StatusOr<std::string> StateStore::CheckPlanFile(const std::string& plan_text) {
  if (dir_.empty()) return std::string();
  const std::string path = Path("plan.json");
  // A plan.json bigger than the plan (plus its newline) is wrong unread.
  StatusOr<std::optional<std::string>> text = ReadBounded(path, plan_text.size() + 1);
  std::string wrong;
  if (!text.ok()) {
    wrong = "unreadable or larger than the plan";
  } else if (!text->has_value()) {
    wrong = "missing";
  } else if (**text != plan_text + "\n") {
    wrong = "not the plan of world.json (edited, or from another world)";
  }
  if (wrong.empty()) return wrong;
  WSYNC_RETURN_IF_ERROR(WriteLineAtomically(path, plan_text));
  return wrong;
}

}  // namespace wsync::controller
