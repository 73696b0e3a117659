#include "transport/libfabric/cpu_affinity.h"

#include <hwloc.h>

#include <cstring>
#include <memory>

namespace wsync::transport::fabric {
namespace {

struct TopologyCloser {
  void operator()(hwloc_topology* t) const noexcept { hwloc_topology_destroy(t); }
};
struct BitmapFreer {
  void operator()(hwloc_bitmap_s* b) const noexcept { hwloc_bitmap_free(b); }
};

hwloc_obj_t FindGpu(hwloc_topology_t topo, int gpu) {
  const std::string names[] = {"cuda" + std::to_string(gpu), "nvml" + std::to_string(gpu)};
  for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os != nullptr;
       os = hwloc_get_next_osdev(topo, os)) {
    for (const std::string& name : names)
      if (os->name != nullptr && name == os->name) return os;
  }
  return nullptr;
}

}  // namespace

Status PinCurrentThread(const std::string& gpu_pci_bus_id, int gpu, int core, std::string* where) {
  *where = "not pinned";
  if (gpu_pci_bus_id.empty() && gpu < 0 && core < 0) return Status::Ok();
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return Internal("hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, TopologyCloser> topo(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(raw) != 0) return Internal(std::string("hwloc_topology_load: ") + strerror(errno));
  std::unique_ptr<hwloc_bitmap_s, BitmapFreer> set(hwloc_bitmap_alloc());
  hwloc_obj_t gpu_obj = nullptr;
  if (!gpu_pci_bus_id.empty()) gpu_obj = hwloc_get_pcidev_by_busidstring(raw, gpu_pci_bus_id.c_str());
  if (gpu_obj == nullptr && gpu >= 0) gpu_obj = FindGpu(raw, gpu);
  if (gpu_obj != nullptr) {
    hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(raw, gpu_obj);
    hwloc_bitmap_copy(set.get(), local->cpuset);
    *where = "core near GPU " + (gpu_pci_bus_id.empty() ? std::to_string(gpu) : gpu_pci_bus_id) + " (" +
             hwloc_obj_type_string(local->type) + " " + std::to_string(local->logical_index) + ")";
  } else if (core >= 0) {
    hwloc_obj_t c = hwloc_get_obj_by_type(raw, HWLOC_OBJ_CORE, static_cast<unsigned>(core));
    if (c == nullptr)
      return InvalidArgument("pin core " + std::to_string(core) + ": machine has only " +
                             std::to_string(hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_CORE)) + " cores");
    hwloc_bitmap_copy(set.get(), c->cpuset);
    *where = "core " + std::to_string(core) + (gpu >= 0 ? " (GPU " + std::to_string(gpu) + " not found by hwloc)" : "");
  } else {
    *where = "not pinned (GPU " + std::to_string(gpu) + " not found by hwloc)";
    return Status::Ok();
  }
  hwloc_bitmap_singlify(set.get());  // one PU: the worker must not migrate
  if (hwloc_set_cpubind(raw, set.get(), HWLOC_CPUBIND_THREAD) != 0)
    return Internal(std::string("hwloc_set_cpubind: ") + strerror(errno));
  return Status::Ok();
}

}  // namespace wsync::transport::fabric
