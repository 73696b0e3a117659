// The weight store as an engine sees it: a separate process maps it by name,
// finds tensors by engine name where the spec put them, and reads the
// version word the agent moves.
#include "inference_agent/weight_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "inference_agent/engine_view.h"

namespace wsync::inference {
namespace {

InferenceRank SmallRank() {
  InferenceRank r;
  r.rank = 1;
  r.regions = {{"weights", 1 << 20, ""}};
  InferenceTensor a;
  a.name = "model.embed_tokens.weight";
  a.shape = {64, 32};
  a.dtype = DType::kBF16;
  a.where = {"weights", 0};
  InferenceTensor b;
  b.name = "model.layers.0.mlp.down_proj.weight";
  b.shape = {128, 128};
  b.dtype = DType::kFP8E4M3;
  b.where = {"weights", 8192};
  b.scale = ScaleTensor{"model.layers.0.mlp.down_proj.weight_scale_inv", {1, 1}, DType::kFP32, {"weights", 65536}};
  r.tensors = {a, b};
  return r;
}

std::string TestName(const char* what) { return "/wsync-test-" + std::string(what) + "-" + std::to_string(getpid()); }

// Runs `fn` in a child process; returns its exit code.
template <typename Fn>
int InChild(Fn fn) {
  const pid_t pid = fork();
  if (pid == 0) _exit(fn());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

TEST(WeightStoreTest, EngineProcessFindsTensorsWhereTheSpecPutsThem) {
  const InferenceRank rank = SmallRank();
  StatusOr<WeightStore> store = WeightStore::Create(TestName("find"), rank);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_EQ(store->regions().size(), 1u);
  ASSERT_EQ(store->regions()[0].size, 1u << 20);
  // Fill the region through the raw pointer at the spec offsets, as a remote
  // write would.
  std::mt19937 rng(7);
  std::vector<uint8_t> embed(64 * 32 * 2), down(128 * 128), scale(4);
  for (auto* v : {&embed, &down, &scale}) for (uint8_t& b : *v) b = static_cast<uint8_t>(rng());
  uint8_t* base = store->regions()[0].data;
  std::memcpy(base + 0, embed.data(), embed.size());
  std::memcpy(base + 8192, down.data(), down.size());
  std::memcpy(base + 65536, scale.data(), scale.size());
  const uint64_t hash = store->layout_hash();

  const int rc = InChild([&] {
    StatusOr<EngineView> view = EngineView::Open(store->name());
    if (!view.ok()) return 2;
    if (view->rank() != 1 || view->layout_hash() != hash || view->tensors().size() != 3) return 3;
    const EngineTensor* e = view->Find("model.embed_tokens.weight");
    const EngineTensor* d = view->Find("model.layers.0.mlp.down_proj.weight");
    const EngineTensor* s = view->Find("model.layers.0.mlp.down_proj.weight_scale_inv");
    if (e == nullptr || d == nullptr || s == nullptr || view->Find("nope") != nullptr) return 4;
    if (e->bytes != embed.size() || e->dtype != "bf16" || e->shape != std::vector<int64_t>{64, 32}) return 5;
    if (d->dtype != "fp8_e4m3" || s->bytes != 4 || s->offset != 65536) return 6;
    if (std::memcmp(e->data, embed.data(), embed.size()) != 0) return 7;
    if (std::memcmp(d->data, down.data(), down.size()) != 0) return 8;
    if (std::memcmp(s->data, scale.data(), scale.size()) != 0) return 9;
    if (view->complete_version() != kNoVersion || view->failed_version() != kNoVersion) return 10;
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

TEST(WeightStoreTest, EngineSeesVersionWordsTheAgentStores) {
  StatusOr<WeightStore> store = WeightStore::Create(TestName("ver"), SmallRank());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  StatusOr<EngineView> view = EngineView::Open(store->name());
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->complete_version(), kNoVersion);
  EXPECT_TRUE(store->MarkComplete(3));
  EXPECT_EQ(view->complete_version(), 3u);
  EXPECT_FALSE(store->MarkComplete(2));  // never backwards
  EXPECT_EQ(view->complete_version(), 3u);
  EXPECT_EQ(view->completed_versions(), 2u);
  store->MarkFailed(4);
  EXPECT_EQ(view->failed_version(), 4u);
  EXPECT_EQ(view->complete_version(), 3u);
}

// An engine-paced engine asks for an update through the header's words (as
// StoreVersions.update writes them, at the offsets the format pins): the
// agent sees one ask per sequence number and answers it with the version
// and a message cut to the word's size.
TEST(WeightStoreTest, AnEnginesUpdateAskIsSeenOnceAndAnswered) {
  StatusOr<WeightStore> store = WeightStore::Create(TestName("ask"), SmallRank());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  WeightStore::UpdateChannel channel = store->update_channel();
  EXPECT_FALSE(channel.Pending().has_value()) << "a new store holds no ask";
  int fd = shm_open(store->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  auto* words = static_cast<uint64_t*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(words, MAP_FAILED);
  words[200 / 8] = 7;     // version
  words[208 / 8] = 1500;  // timeout ms
  __atomic_store_n(&words[192 / 8], 1, __ATOMIC_RELEASE);
  std::optional<WeightStore::UpdateChannel::Request> ask = channel.Pending();
  ASSERT_TRUE(ask.has_value());
  EXPECT_EQ(ask->seq, 1u);
  EXPECT_EQ(ask->version, 7u);
  EXPECT_EQ(ask->timeout_ms, 1500u);
  channel.Answer(1, 6, kUpdateFailed, std::string(2000, 'x'));
  EXPECT_FALSE(channel.Pending().has_value()) << "an answered ask is not seen again";
  EXPECT_EQ(words[256 / 8], 1u);
  EXPECT_EQ(words[264 / 8], 6u);
  EXPECT_EQ(words[272 / 8], kUpdateFailed);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(words) + 280).size(), 511u) << "cut, NUL-terminated";
  munmap(words, 4096);
}

// Shadow mode copies a version in: meanwhile the weights are a mix (the
// failed word says so to any engine), but an engine waiting for that
// version must see that it is being copied, not failed; a copy that fails
// clears the word, and only then is the version failed.
TEST(WeightStoreTest, ACopyInFromTheShadowIsNotAFailureUntilItFails) {
  StatusOr<WeightStore> store = WeightStore::Create(TestName("commit"), SmallRank());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  StatusOr<EngineView> view = EngineView::Open(store->name());
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->committing_version(), kNoVersion);

  store->MarkCommitting(1);
  EXPECT_EQ(view->committing_version(), 1u);
  EXPECT_EQ(view->failed_version(), 1u) << "mid-copy the bytes are a mix";
  EXPECT_EQ(view->failed_versions(), 0u) << "a copy in progress is not counted as a failure";
  EXPECT_TRUE(store->MarkComplete(1));
  EXPECT_EQ(view->complete_version(), 1u);

  store->MarkCommitting(2);
  store->MarkFailed(2);
  EXPECT_EQ(view->committing_version(), kNoVersion) << "a failed copy is a failed version";
  EXPECT_EQ(view->failed_version(), 2u);
  EXPECT_EQ(view->failed_versions(), 1u);
  EXPECT_EQ(view->complete_version(), 1u);

  store->MarkCommitting(3);
  store->MarkFailed(2);  // an older version's failure leaves the copy of 3 alone
  EXPECT_EQ(view->committing_version(), 3u);
}

TEST(WeightStoreTest, AttachKeepsWeightsAndVersionButRefusesAnotherLayout) {
  const std::string name = TestName("attach");
  StatusOr<WeightStore> store = WeightStore::Create(name, SmallRank());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  store->regions()[0].data[100] = 0x5a;
  store->MarkComplete(9);
  {
    StatusOr<WeightStore> again = WeightStore::Attach(name, SmallRank());
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->regions()[0].data[100], 0x5a);
    EXPECT_EQ(again->complete_version(), 9u);
  }
  InferenceRank other = SmallRank();
  other.tensors[0].shape = {32, 64};
  StatusOr<WeightStore> wrong = WeightStore::Attach(name, other);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("different layout"), std::string::npos) << wrong.status().message();
}

TEST(WeightStoreTest, RecreatingLeavesAnEngineOnTheOldStoreReadingValidMemory) {
  const std::string name = TestName("recreate");
  StatusOr<WeightStore> first = WeightStore::Create(name, SmallRank());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  first->regions()[0].data[0] = 0x11;
  StatusOr<EngineView> old_view = EngineView::Open(name);
  ASSERT_TRUE(old_view.ok()) << old_view.status().ToString();
  first->KeepName();  // the name now belongs to the new store
  StatusOr<WeightStore> second = WeightStore::Create(name, SmallRank());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  // Not truncated under the engine: its mapping still reads (no SIGBUS).
  EXPECT_EQ(old_view->Find("model.embed_tokens.weight")->data[0], 0x11);
  StatusOr<EngineView> new_view = EngineView::Open(name);
  ASSERT_TRUE(new_view.ok());
  EXPECT_EQ(new_view->Find("model.embed_tokens.weight")->data[0], 0);
}

TEST(WeightStoreTest, TensorOutsideItsRegionIsOneLineNamingIt) {
  InferenceRank r = SmallRank();
  r.tensors[1].where.offset = (1 << 20) - 100;
  StatusOr<WeightStore> store = WeightStore::Create(TestName("bad"), r);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("model.layers.0.mlp.down_proj.weight"), std::string::npos);
  EXPECT_NE(store.status().message().find("inference rank 1"), std::string::npos);
  EXPECT_FALSE(EngineView::Open(TestName("bad")).ok());  // nothing half-built left behind
}

TEST(WeightStoreTest, LargeLayoutPushesTheDataPastIt) {
  InferenceRank r;
  r.rank = 0;
  r.regions = {{"weights", 4096 * 1000, ""}, {"extra", 4096, ""}};
  for (int i = 0; i < 1000; ++i) {
    InferenceTensor t;
    t.name = "model.layers." + std::to_string(i) + ".some_rather_long_parameter_name.weight";
    t.shape = {2048};
    t.where = {"weights", static_cast<uint64_t>(i) * 4096};
    r.tensors.push_back(t);
  }
  InferenceTensor x;
  x.name = "x";
  x.shape = {4};
  x.dtype = DType::kFP32;
  x.where = {"extra", 16};
  r.tensors.push_back(x);
  StatusOr<WeightStore> store = WeightStore::Create(TestName("large"), r);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  store->regions()[1].data[16] = 0x77;
  store->regions()[0].data[999 * 4096] = 0x66;
  StatusOr<EngineView> view = EngineView::Open(store->name());
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->Find("x")->data[0], 0x77);
  EXPECT_EQ(view->Find("model.layers.999.some_rather_long_parameter_name.weight")->data[0], 0x66);
}

}  // namespace
}  // namespace wsync::inference
