// TempArena: the executor's bound on temporary memory. An allocation that
// does not fit waits until memory is given back from another thread (as the
// engine's callback thread does), the peak never passes the capacity, and a
// wait that cannot be satisfied ends at its deadline or on abort.
#include "pipeline/temp_arena.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "transport/libfabric/libfabric_engine.h"

namespace wsync {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

class TempArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport::fabric::LibfabricOptions o;
    o.provider = "shm";
    auto e = transport::fabric::CreateLibfabricEngine(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
  }
  std::unique_ptr<transport::Engine> engine_;
};

TEST_F(TempArenaTest, WaitsForFreesAndNeverPassesCapacity) {
  auto arena = TempArena::Create(4096, engine_.get());
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  TempArena& a = **arena;
  EXPECT_EQ(a.capacity(), 4096u);
  ASSERT_NE(a.region(), nullptr);
  bool waited = true;
  auto never = [] { return false; };
  const auto far = Clock::now() + milliseconds(10000);
  StatusOr<uint64_t> x = a.Allocate(1000, far, never, &waited);  // rounds to 1024
  ASSERT_TRUE(x.ok());
  EXPECT_FALSE(waited);
  StatusOr<uint64_t> y = a.Allocate(3072, far, never, &waited);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(a.used(), 4096u);

  // Full: the next allocation waits until another thread gives back memory
  // that is contiguous and large enough (two halves freed out of order).
  std::thread giver([&] {
    std::this_thread::sleep_for(milliseconds(50));
    a.Free(*y + 1024, 2048);  // not enough alone for 2560 contiguous with the rest
    std::this_thread::sleep_for(milliseconds(50));
    a.Free(*y, 1024);
  });
  const auto t0 = Clock::now();
  StatusOr<uint64_t> z = a.Allocate(2560, far, never, &waited);
  giver.join();
  ASSERT_TRUE(z.ok()) << z.status().ToString();
  EXPECT_TRUE(waited);
  EXPECT_GE(Clock::now() - t0, milliseconds(90));
  EXPECT_LE(a.peak(), a.capacity());
  EXPECT_EQ(a.peak(), 4096u);
  a.Free(*x, 1000);
  a.Free(*z, 2560);
  EXPECT_EQ(a.used(), 0u);
  // Coalesced again: the whole capacity fits in one piece.
  StatusOr<uint64_t> all = a.Allocate(4096, far, never, &waited);
  ASSERT_TRUE(all.ok());
  EXPECT_FALSE(waited);
  a.Free(*all, 4096);
}

TEST_F(TempArenaTest, ImpossibleOrAbandonedWaitsEnd) {
  auto arena = TempArena::Create(2048, engine_.get());
  ASSERT_TRUE(arena.ok());
  TempArena& a = **arena;
  bool waited = false;
  auto never = [] { return false; };
  EXPECT_EQ(a.Allocate(4096, Clock::now() + milliseconds(10000), never, &waited).status().code(),
            StatusCode::kInvalidArgument);
  StatusOr<uint64_t> held = a.Allocate(2048, Clock::now(), never, &waited);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(a.Allocate(256, Clock::now() + milliseconds(50), never, &waited).status().code(),
            StatusCode::kDeadlineExceeded);
  std::atomic<bool> abort{false};
  std::thread poker([&] {
    std::this_thread::sleep_for(milliseconds(30));
    abort.store(true);
    a.Poke();
  });
  EXPECT_EQ(a.Allocate(256, Clock::now() + milliseconds(10000), [&] { return abort.load(); }, &waited)
                .status()
                .code(),
            StatusCode::kAborted);
  poker.join();
  a.Free(*held, 2048);
}

}  // namespace
}  // namespace wsync
