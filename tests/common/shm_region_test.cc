#include "common/shm_region.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace wsync {
namespace {

TEST(ShmRegionTest, BytesWrittenByOneProcessAreSeenByAnother) {
  const std::string name = "/wsync-test-" + std::to_string(getpid());
  StatusOr<ShmRegion> region = ShmRegion::Create(name, 1 << 20);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  EXPECT_EQ(region->data()[12345], 0);  // zero-filled
  const pid_t child = fork();
  if (child == 0) {
    StatusOr<ShmRegion> view = ShmRegion::Open(name);
    if (!view.ok() || view->size() != (1u << 20)) _exit(2);
    for (size_t i = 0; i < view->size(); ++i) view->data()[i] = static_cast<uint8_t>(i * 7);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (size_t i = 0; i < region->size(); i += 4099) {
    ASSERT_EQ(region->data()[i], static_cast<uint8_t>(i * 7)) << i;
  }
}

TEST(ShmRegionTest, OpeningAMissingRegionNamesIt) {
  StatusOr<ShmRegion> r = ShmRegion::Open("/wsync-no-such-region");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/wsync-no-such-region"), std::string::npos);
}

TEST(ShmRegionTest, CreatorRemovesTheNameWhenDestroyed) {
  const std::string name = "/wsync-test-unlink-" + std::to_string(getpid());
  { ASSERT_TRUE(ShmRegion::Create(name, 4096).ok()); }
  EXPECT_FALSE(ShmRegion::Open(name).ok());
}

}  // namespace
}  // namespace wsync
