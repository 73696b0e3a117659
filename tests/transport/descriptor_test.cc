#include <gtest/gtest.h>

#include "transport/engine.h"

namespace wsync::transport {
namespace {

TEST(DescriptorTest, RoundTripsEveryField) {
  MemoryDescriptor d;
  d.address = 0x7f0011223344;
  d.length = 1 << 20;
  d.nics = {{std::string("\x00\x01nic-a", 7), 42}, {"nic-b", 0xffffffffffffull}};
  StatusOr<MemoryDescriptor> back = MemoryDescriptor::Parse(d.Serialize());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->address, d.address);
  EXPECT_EQ(back->length, d.length);
  ASSERT_EQ(back->nics.size(), 2u);
  EXPECT_EQ(back->nics[0].nic_address, d.nics[0].nic_address);
  EXPECT_EQ(back->nics[1].key, d.nics[1].key);
}

TEST(DescriptorTest, RefusesTruncatedAndForeignBytes) {
  MemoryDescriptor d;
  d.length = 10;
  d.nics = {{"nic", 1}};
  const std::string bytes = d.Serialize();
  EXPECT_FALSE(MemoryDescriptor::Parse(bytes.substr(0, bytes.size() - 1)).ok());
  EXPECT_FALSE(MemoryDescriptor::Parse(bytes + "x").ok());
  EXPECT_FALSE(MemoryDescriptor::Parse("not a descriptor").ok());
  PeerAddress a{{"x", "y"}};
  EXPECT_FALSE(MemoryDescriptor::Parse(a.Serialize()).ok());
  StatusOr<PeerAddress> pa = PeerAddress::Parse(a.Serialize());
  ASSERT_TRUE(pa.ok());
  EXPECT_EQ(pa->nics, a.nics);
}

}  // namespace
}  // namespace wsync::transport
