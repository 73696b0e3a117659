#include "transport/libfabric/imm_counter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace wsync::transport::fabric {
namespace {

using TimePoint = ImmCounter::TimePoint;
int waiter_a, waiter_b;

TEST(ImmCounterTest, FiresOnceWhateverOrderArrivalsComeIn) {
  ImmCounter counter;
  std::vector<uint32_t> arrivals;
  for (uint32_t imm = 1; imm <= 3; ++imm)
    for (int i = 0; i < 100; ++i) arrivals.push_back(imm);
  std::shuffle(arrivals.begin(), arrivals.end(), std::mt19937(7));
  void* fired = nullptr;
  ASSERT_TRUE(counter.Expect(2, 100, &waiter_a, TimePoint::max(), &fired));
  EXPECT_EQ(fired, nullptr);
  int fires = 0;
  for (uint32_t imm : arrivals) fires += counter.OnArrival(imm) == &waiter_a;
  EXPECT_EQ(fires, 1);
  EXPECT_EQ(counter.waiters(), 0u);
}

TEST(ImmCounterTest, ArrivalsBeforeExpectCountAndExtrasCarryOver) {
  ImmCounter counter;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(counter.OnArrival(9), nullptr);
  void* fired = nullptr;
  ASSERT_TRUE(counter.Expect(9, 3, &waiter_a, TimePoint::max(), &fired));
  EXPECT_EQ(fired, &waiter_a);  // already satisfied: fires at once
  ASSERT_TRUE(counter.Expect(9, 3, &waiter_b, TimePoint::max(), &fired));
  EXPECT_EQ(fired, nullptr);    // 2 carried over, needs one more
  EXPECT_EQ(counter.OnArrival(9), &waiter_b);
}

TEST(ImmCounterTest, SecondExpectOfSameImmIsRefused) {
  ImmCounter counter;
  void* fired = nullptr;
  ASSERT_TRUE(counter.Expect(4, 2, &waiter_a, TimePoint::max(), &fired));
  EXPECT_FALSE(counter.Expect(4, 2, &waiter_b, TimePoint::max(), &fired));
}

TEST(ImmCounterTest, DeadlineExpiresInsteadOfFiring) {
  ImmCounter counter;
  void* fired = nullptr;
  const TimePoint t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(counter.Expect(1, 2, &waiter_a, t0 + std::chrono::seconds(1), &fired));
  counter.OnArrival(1);
  std::vector<ImmCounter::Expired> expired;
  counter.ExpireBefore(t0, &expired);
  EXPECT_TRUE(expired.empty());
  counter.ExpireBefore(t0 + std::chrono::seconds(2), &expired);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].waiter, &waiter_a);
  EXPECT_EQ(expired[0].seen, 1u);
  EXPECT_EQ(counter.OnArrival(1), nullptr);  // expired waiters never fire
}

}  // namespace
}  // namespace wsync::transport::fabric
