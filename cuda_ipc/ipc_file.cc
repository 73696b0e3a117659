#include "cuda_ipc/ipc_file.h"

#include <algorithm>
#include <map>
#include <optional>

#include "common/hex.h"
#include "routing/json_reader.h"

namespace wsync::cuda_ipc {

StatusOr<Export> ReadFile(const std::string& path, const std::vector<Expected>& expected, const std::string& owner) {
  WSYNC_ASSIGN_OR_RETURN(nlohmann::json doc, ReadJsonFile(path));
  if (!doc.is_object() || doc.value("schema", std::string()) != kSchema) {
    return InvalidArgument(path + ": not a " + std::string(kSchema) + " document (its 'schema')");
  }
  const auto regions = doc.find("regions");
  if (regions == doc.end() || !regions->is_array()) return InvalidArgument(path + ": no 'regions' array");
  std::map<std::string, Region> by_id;
  for (size_t i = 0; i < regions->size(); ++i) {
    const nlohmann::json& r = (*regions)[i];
    const std::string where = path + ": regions[" + std::to_string(i) + "]";
    if (!r.is_object() || !r.contains("id") || !r["id"].is_string()) return InvalidArgument(where + ": no string 'id'");
    Region out;
    out.id = r["id"].get<std::string>();
    const std::string named = path + ": region '" + out.id + "'";
    for (const char* key : {"device", "offset", "bytes"}) {
      if (!r.contains(key) || !r[key].is_number_integer() || r[key].get<int64_t>() < 0) {
        return InvalidArgument(named + ": '" + key + "' must be a non-negative integer");
      }
    }
    out.device = r["device"].get<int>();
    if (r.contains("pci_bus_id")) {
      if (!r["pci_bus_id"].is_string()) return InvalidArgument(named + ": 'pci_bus_id' must be a string");
      out.pci_bus_id = r["pci_bus_id"].get<std::string>();
    }
    out.offset = r["offset"].get<uint64_t>();
    out.bytes = r["bytes"].get<uint64_t>();
    if (out.offset + out.bytes < out.offset) return InvalidArgument(named + ": 'offset' + 'bytes' overflows");
    const std::string hex = r.value("handle", std::string());
    if (hex.size() != 2 * kHandleBytes) {
      return InvalidArgument(named + ": 'handle' must be " + std::to_string(2 * kHandleBytes) +
                             " hex digits (a cudaIpcMemHandle_t), got " + std::to_string(hex.size()) + " characters");
    }
    const std::optional<std::string> handle = HexToBytes(hex);
    if (!handle.has_value()) return InvalidArgument(named + ": 'handle' is not hex");
    std::copy(handle->begin(), handle->end(), out.handle.begin());
    if (!by_id.emplace(out.id, out).second) return InvalidArgument(named + ": given twice");
  }
  Export ipc;
  ipc.pid = doc.value("pid", int64_t{0});
  for (const Expected& want : expected) {
    auto it = by_id.find(want.id);
    if (it == by_id.end()) return NotFound(path + ": " + owner + "'s region '" + want.id + "' is not exported");
    if (it->second.bytes != want.bytes) {
      return InvalidArgument(path + ": region '" + want.id + "' is " + std::to_string(it->second.bytes) +
                             " bytes, the layout says " + std::to_string(want.bytes));
    }
    ipc.regions.push_back(it->second);
    by_id.erase(it);
  }
  if (!by_id.empty()) {
    return InvalidArgument(path + ": region '" + by_id.begin()->first + "' is not in " + owner + "'s layout");
  }
  return ipc;
}

}  // namespace wsync::cuda_ipc
