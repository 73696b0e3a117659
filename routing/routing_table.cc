#include "routing/routing_table.h"

#include <cstdint>
#include <string>

namespace wsync {

WriteOp PlaneOf(const WriteOp& op, uint32_t p) {
  WriteOp one = op;
  if (op.planes <= 1) return one;
  one.planes = 1;
  one.plane_dim = -1;
  one.plane_stride = 0;
  one.bytes = op.bytes / op.planes;
  one.dst_offset = op.dst_offset + p * op.plane_stride;
  one.src_box.offset[op.plane_dim] += p;
  one.src_box.size[op.plane_dim] = 1;
  return one;
}

uint64_t WriteCount(const std::vector<WriteOp>& ops) {
  uint64_t n = 0;
  for (const WriteOp& op : ops) n += op.planes;
  return n;
}

std::vector<WriteOp> ExpandPlanes(const std::vector<WriteOp>& ops) {
  std::vector<WriteOp> out;
  out.reserve(WriteCount(ops));
  for (const WriteOp& op : ops)
    for (uint32_t p = 0; p < op.planes; ++p) out.push_back(PlaneOf(op, p));
  return out;
}

std::string StridedWriteError(uint64_t planes, int64_t plane_dim, uint64_t plane_stride, uint64_t bytes,
                              const Box* box) {
  const std::string n = std::to_string(planes);
  if (planes == 0) return "a strided write needs at least one plane";
  if (planes == 1) return plane_dim == -1 && plane_stride == 0 ? "" : "a write of one plane has no plane_dim or stride";
  if (planes > UINT32_MAX) return n + " planes is more than a write may have";
  if (box && (plane_dim < 0 || plane_dim >= box->ndim))
    return "plane_dim " + std::to_string(plane_dim) + " is not a dim of its " + std::to_string(box->ndim) + "-d box";
  if (box && static_cast<uint64_t>(box->size[plane_dim]) != planes)
    return "its box spans " + std::to_string(box->size[plane_dim]) + " along plane_dim " + std::to_string(plane_dim) +
           ", not its " + n + " planes";
  if (bytes % planes != 0) return std::to_string(bytes) + " bytes do not divide into " + n + " equal planes";
  if (plane_stride < bytes / planes)
    return "planes of " + std::to_string(bytes / planes) + " bytes overlap at a stride of " +
           std::to_string(plane_stride);
  if (plane_stride > (UINT64_MAX - bytes) / (planes - 1))
    return "a stride of " + std::to_string(plane_stride) + " bytes over " + n + " planes passes 2^64";
  return "";
}

}  // namespace wsync
