// Wire format of MemoryDescriptor and PeerAddress: what one process hands
// another (through a file, a pipe, the controller) to make itself writable.
// Little-endian fixed-width fields behind a magic and a version, so a
// truncated or foreign blob is refused with a clear message, not misread.
#include <cstring>
#include <optional>
#include <string>

#include "common/hex.h"
#include "transport/engine.h"

namespace wsync::transport {
namespace {

constexpr uint32_t kDescriptorMagic = 0x44534d57;  // "WMSD"
constexpr uint32_t kPeerMagic = 0x41504d57;        // "WMPA"
constexpr uint32_t kVersion = 1;

void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void PutBytes(std::string& out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U32(uint32_t& v) { return Raw(&v, 4); }
  bool U64(uint64_t& v) { return Raw(&v, 8); }
  bool Bytes(std::string& s) {
    uint32_t n = 0;
    if (!U32(n) || n > in_.size() - pos_) return false;
    s.assign(in_.substr(pos_, n));
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  bool Raw(void* dst, size_t n) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(dst, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

std::string MemoryDescriptor::Serialize() const {
  std::string out;
  PutU32(out, kDescriptorMagic);
  PutU32(out, kVersion);
  PutU64(out, address);
  PutU64(out, length);
  PutU32(out, static_cast<uint32_t>(nics.size()));
  for (const NicKey& nic : nics) {
    PutBytes(out, nic.nic_address);
    PutU64(out, nic.key);
  }
  return out;
}

StatusOr<MemoryDescriptor> MemoryDescriptor::Parse(std::string_view bytes) {
  Reader r(bytes);
  uint32_t magic = 0, version = 0, count = 0;
  MemoryDescriptor d;
  if (!r.U32(magic) || magic != kDescriptorMagic)
    return InvalidArgument("memory descriptor: not a wsync descriptor (bad magic); pass the bytes of MemoryDescriptor::Serialize");
  if (!r.U32(version) || version != kVersion)
    return InvalidArgument("memory descriptor: version " + std::to_string(version) + ", this build reads " + std::to_string(kVersion));
  if (!r.U64(d.address) || !r.U64(d.length) || !r.U32(count) || count == 0 || count > kMaxNics)
    return InvalidArgument("memory descriptor: truncated header or NIC count outside 1.." + std::to_string(kMaxNics));
  d.nics.resize(count);
  for (NicKey& nic : d.nics) {
    if (!r.Bytes(nic.nic_address) || !r.U64(nic.key))
      return InvalidArgument("memory descriptor: truncated NIC entry");
  }
  if (!r.done()) return InvalidArgument("memory descriptor: trailing bytes after the last NIC entry");
  return d;
}

std::string PeerAddress::Serialize() const {
  std::string out;
  PutU32(out, kPeerMagic);
  PutU32(out, kVersion);
  PutU32(out, static_cast<uint32_t>(nics.size()));
  for (const std::string& nic : nics) PutBytes(out, nic);
  return out;
}

StatusOr<PeerAddress> PeerAddress::Parse(std::string_view bytes) {
  Reader r(bytes);
  uint32_t magic = 0, version = 0, count = 0;
  PeerAddress a;
  if (!r.U32(magic) || magic != kPeerMagic)
    return InvalidArgument("peer address: not a wsync peer address (bad magic)");
  if (!r.U32(version) || version != kVersion)
    return InvalidArgument("peer address: version " + std::to_string(version) + ", this build reads " + std::to_string(kVersion));
  if (!r.U32(count) || count == 0 || count > kMaxNics)
    return InvalidArgument("peer address: NIC count outside 1.." + std::to_string(kMaxNics));
  a.nics.resize(count);
  for (std::string& nic : a.nics) {
    if (!r.Bytes(nic)) return InvalidArgument("peer address: truncated NIC entry");
  }
  if (!r.done()) return InvalidArgument("peer address: trailing bytes");
  return a;
}

std::string MemoryDescriptor::ToText() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  const std::string raw = Serialize();
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

StatusOr<MemoryDescriptor> MemoryDescriptor::FromText(std::string_view text) {
  if (text.empty()) return InvalidArgument("memory descriptor: empty (a dry-run spec has no descriptors)");
  if (text.size() % 2 != 0) return InvalidArgument("memory descriptor: odd number of hex digits");
  const std::optional<std::string> raw = HexToBytes(text);
  if (!raw.has_value()) return InvalidArgument("memory descriptor: not hex text");
  return Parse(*raw);
}

}  // namespace wsync::transport
