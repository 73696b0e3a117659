// Transport descriptors (transport/descriptor.cc): MemoryDescriptor and
// PeerAddress bytes one process hands another, and the hex text form that
// travels in registrations and plan slices. Whatever parses must serialize
// back to exactly the bytes it came from.
#include <string>

#include "fuzz/fuzz_support.h"
#include "transport/engine.h"

using namespace wsync;
using transport::MemoryDescriptor;
using transport::PeerAddress;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes = fuzz::Bytes(data, size);
  StatusOr<MemoryDescriptor> d = MemoryDescriptor::Parse(bytes);
  fuzz::CheckError(d.status(), "MemoryDescriptor::Parse");
  if (d.ok() && d->Serialize() != bytes) fuzz::Broken("memory descriptor does not serialize to its bytes");
  StatusOr<PeerAddress> a = PeerAddress::Parse(bytes);
  fuzz::CheckError(a.status(), "PeerAddress::Parse");
  if (a.ok() && a->Serialize() != bytes) fuzz::Broken("peer address does not serialize to its bytes");
  StatusOr<MemoryDescriptor> t = MemoryDescriptor::FromText(bytes);
  fuzz::CheckError(t.status(), "MemoryDescriptor::FromText");
  if (t.ok()) {
    StatusOr<MemoryDescriptor> back = MemoryDescriptor::FromText(t->ToText());
    if (!back.ok() || back->Serialize() != t->Serialize())
      fuzz::Broken("memory descriptor text does not round-trip");
  }
  return 0;
}
