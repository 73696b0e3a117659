// The delta codec against plain byte arithmetic: after Apply the receiver's
// bytes equal the new version's, whatever the element size, change rate or
// chunk boundaries; a delta that does not describe its target changes
// nothing.
#include "delta/codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

namespace wsync::delta {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(gen());
  return b;
}

// `base` with a fraction `rate` of its elements changed (each changed
// element differs in at least one byte).
Bytes Changed(const Bytes& base, uint32_t elem, double rate, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Bytes next = base;
  for (size_t i = 0; i < base.size() / elem; ++i) {
    if (u(gen) < rate) next[i * elem + gen() % elem] ^= static_cast<uint8_t>(1 + gen() % 255);
  }
  return next;
}

size_t ChangedElements(const Bytes& a, const Bytes& b, uint32_t elem) {
  size_t k = 0;
  for (size_t i = 0; i < a.size() / elem; ++i) k += std::memcmp(&a[i * elem], &b[i * elem], elem) != 0;
  return k;
}

struct Sent {
  Encoded encoded;
  Bytes delta;
};

Sent Encode(Bytes& base, const Bytes& next, uint32_t elem, size_t capacity) {
  Sent s;
  s.delta.resize(capacity);
  StatusOr<Encoded> e = EncodeAndAdvance(base.data(), next.data(), next.size(), elem, s.delta.data(), capacity);
  EXPECT_TRUE(e.ok()) << e.status().message();
  s.encoded = *e;
  s.delta.resize(s.encoded.fits ? s.encoded.bytes : 0);
  return s;
}

TEST(DeltaCodec, ReceiverEqualsTheNewVersionForEveryElementSizeAndChangeRate) {
  // 3 whole chunks and a short one: chunk seams and a partial last chunk.
  const size_t elements = 3 * kChunkElements + 1001;
  for (uint32_t elem : {1u, 2u, 4u}) {
    for (double rate : {0.0, 0.0005, 0.03, 0.2, 1.0}) {
      SCOPED_TRACE("elem " + std::to_string(elem) + " rate " + std::to_string(rate));
      const Bytes held = RandomBytes(elements * elem, elem * 7);
      const Bytes next = Changed(held, elem, rate, 11 + elem);
      Bytes trainer_copy = held;
      Bytes receiver = held;
      Sent s = Encode(trainer_copy, next, elem, next.size() * 2);
      ASSERT_TRUE(s.encoded.fits);
      EXPECT_EQ(s.encoded.changes, ChangedElements(held, next, elem));
      EXPECT_EQ(trainer_copy, next) << "the trainer's copy advances to what it sent";
      Status st = Apply(s.delta.data(), s.delta.size(), receiver.data(), receiver.size(), "w");
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(receiver, next);
    }
  }
}

TEST(DeltaCodec, SendsAFractionOfTheBytesAtRlChangeRates) {
  // bf16 at the measured rates (docs/DELTAS.md): 3.4% and 20% of elements.
  const size_t elements = 8 * kChunkElements;
  const Bytes held = RandomBytes(elements * 2, 3);
  for (auto [rate, most] : {std::pair{0.034, 0.075}, std::pair{0.2, 0.28}}) {
    Bytes copy = held;
    Sent s = Encode(copy, Changed(held, 2, rate, 5), 2, held.size());
    ASSERT_TRUE(s.encoded.fits);
    const double fraction = static_cast<double>(s.encoded.bytes) / static_cast<double>(held.size());
    EXPECT_LT(fraction, most) << rate << " of elements changed";
    // 2 bytes of index per change would be 2 * rate of the bytes: at 20%
    // the bitmap must have been chosen.
    if (rate > 0.1) {
      EXPECT_LT(fraction, 2 * rate);
    }
  }
}

TEST(DeltaCodec, ADeltaThatWouldNotFitSaysSoAndStillAdvancesTheCopy) {
  const Bytes held = RandomBytes(2 * kChunkElements, 9);
  const Bytes next = Changed(held, 1, 0.5, 10);
  Bytes copy = held;
  Sent s = Encode(copy, next, 1, held.size() / 4);
  EXPECT_FALSE(s.encoded.fits);
  EXPECT_EQ(s.encoded.changes, ChangedElements(held, next, 1));
  EXPECT_EQ(copy, next) << "the caller sends the region whole; its copy already matches";
  // Even a capacity below the header: no write past it.
  Bytes tiny(8, 0xAB);
  copy = held;
  StatusOr<Encoded> e = EncodeAndAdvance(copy.data(), next.data(), next.size(), 1, tiny.data(), tiny.size());
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e->fits);
}

TEST(DeltaCodec, RefusesRegionsThatAreNotWholeElements) {
  Bytes a(10), b(10), out(100);
  StatusOr<Encoded> e = EncodeAndAdvance(a.data(), b.data(), 10, 4, out.data(), out.size());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("10 bytes are not whole elements of 4"), std::string::npos)
      << e.status().message();
  EXPECT_FALSE(EncodeAndAdvance(a.data(), b.data(), 9, 3, out.data(), out.size()).ok());
}

// A delta damaged one way or another: Apply refuses it, names the field and
// leaves the target exactly as it was.
TEST(DeltaCodec, ADeltaThatDoesNotDescribeItsTargetChangesNothing) {
  const size_t elements = kChunkElements + 100;  // a short second chunk
  const Bytes held = RandomBytes(elements * 2, 21);
  // Sparse: every 1000th element and one in the short chunk (indices).
  Bytes few = held;
  for (size_t i = 0; i < elements; i += 1000) few[2 * i] ^= 1;
  few[2 * (kChunkElements + 7)] ^= 1;
  Bytes copy = held;
  const Bytes sparse = Encode(copy, few, 2, held.size()).delta;
  copy = held;
  const Bytes dense = Encode(copy, Changed(held, 2, 0.5, 23), 2, held.size()).delta;
  ASSERT_FALSE(sparse.empty());
  ASSERT_FALSE(dense.empty());
  const size_t counts = kHeaderBytes, where = kHeaderBytes + 8;

  struct Case {
    const char* name;
    const Bytes* delta;
    std::function<void(Bytes&)> damage;
    size_t target_bytes;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"another target size", &sparse, [](Bytes&) {}, held.size() - 2, "the target holds"},
      {"magic", &sparse, [](Bytes& d) { d[0] ^= 1; }, held.size(), "magic"},
      {"element size", &sparse, [](Bytes& d) { d[4] = 3; }, held.size(), "element size 3"},
      {"truncated", &sparse, [](Bytes& d) { d.resize(d.size() - 1); }, held.size(), "length should be"},
      {"too short", &sparse, [](Bytes& d) { d.resize(20); }, held.size(), "header"},
      {"count", &sparse, [&](Bytes& d) { d[counts] += 1; }, held.size(), "of"},
      {"index past a short chunk", &sparse,
       [&](Bytes& d) {
         // The last index of the second chunk (100 elements) points past it.
         uint32_t k0, k1;
         std::memcpy(&k0, &d[counts], 4);
         std::memcpy(&k1, &d[counts + 4], 4);
         ASSERT_EQ(k1, 1u);
         const uint16_t past = 100;
         std::memcpy(&d[where + 2 * (k0 + k1 - 1)], &past, 2);
       },
       held.size(), "at element 100"},
      {"indices out of order", &sparse,
       [&](Bytes& d) {
         uint16_t i0, i1;
         std::memcpy(&i0, &d[where], 2);
         std::memcpy(&i1, &d[where + 2], 2);
         std::memcpy(&d[where], &i1, 2);
         std::memcpy(&d[where + 2], &i0, 2);
       },
       held.size(), "after"},
      {"bitmap bit cleared", &dense, [&](Bytes& d) { d[where] = 0; }, held.size(), "bits set"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Bytes d = *c.delta;
    c.damage(d);
    Bytes target(c.target_bytes);
    std::memcpy(target.data(), held.data(), std::min(held.size(), target.size()));
    const Bytes before = target;
    Status st = Apply(d.data(), d.size(), target.data(), target.size(), "layers.0.w");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("delta for layers.0.w"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("nothing applied"), std::string::npos) << st.message();
    EXPECT_EQ(target, before);
  }
}

}  // namespace
}  // namespace wsync::delta
