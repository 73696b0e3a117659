// GlooGroup: full_tensor all-gathers give back exactly the unsharded tensor
// for torch.chunk sharding (uneven and empty shards included), with ranks as
// threads and as real processes over loopback tcp; a missing or dead peer
// ends in an error within the timeout, never a hang.
#include "pipeline/collectives.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

namespace wsync {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

GlooGroupOptions Options(milliseconds timeout) {
  GlooGroupOptions o;
  o.hostname = "127.0.0.1";
  o.timeout = timeout;
  return o;
}

// Element bytes of a full row-major tensor: a distinct pattern per byte.
std::vector<uint8_t> MakeFull(const std::vector<int64_t>& shape, int64_t elem) {
  int64_t n = elem;
  for (int64_t d : shape) n *= d;
  std::vector<uint8_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + 7) ^ (i >> 8));
  return v;
}

// Rank r's shard cut directly from the full tensor by index arithmetic: the
// multi-index of every element, kept when its `dim` coordinate falls in
// [begin, begin + len).
std::vector<uint8_t> CutShard(const std::vector<uint8_t>& full, const std::vector<int64_t>& shape,
                              int dim, int64_t begin, int64_t len, int64_t elem) {
  std::vector<uint8_t> out;
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, coord = 0;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (d == dim) coord = rest % shape[d];
      rest /= shape[d];
    }
    if (coord >= begin && coord < begin + len) {
      out.insert(out.end(), full.begin() + i * elem, full.begin() + (i + 1) * elem);
    }
  }
  return out;
}

// Runs fn(rank) on `size` threads and joins them.
void RunRanks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

std::string MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "wsync-gloo-XXXXXX").string();
  char* dir = mkdtemp(tmpl.data());
  return dir ? std::string(dir) : std::string();
}

TEST(TorchChunkTest, MatchesTorchChunkIncludingEmptyTrailingShards) {
  auto sizes = [](int64_t n, int64_t k) {
    std::vector<int64_t> s;
    for (int64_t r = 0; r < k; ++r) s.push_back(TorchChunk(n, k, r).size);
    return s;
  };
  EXPECT_EQ(sizes(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(sizes(5, 4), (std::vector<int64_t>{2, 2, 1, 0}));
  EXPECT_EQ(sizes(3, 4), (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(sizes(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(sizes(0, 3), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(TorchChunk(10, 4, 3).begin, 9);
  EXPECT_EQ(TorchChunk(2, 4, 3).begin, 2);
}

struct GatherCase {
  std::vector<int64_t> shape;
  int dim;
  DType dtype;
};

class ThreadRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadRanksTest, AllGatherRebuildsTheFullTensor) {
  const int size = GetParam();
  // Uneven chunks, empty shards (n < size), gathers along inner dims.
  const std::vector<GatherCase> cases = {
      {{10, 6}, 0, DType::kBF16}, {{3, 5}, 0, DType::kFP32},    {{2, 4}, 0, DType::kBF16},
      {{4, 7, 3}, 1, DType::kBF16}, {{3, 2, 5}, 1, DType::kFP32}, {{6, 5}, 1, DType::kFP8E4M3},
      {{2, 3, 1}, 2, DType::kBF16}, {{0, 4}, 1, DType::kFP32},
  };
  auto store = MakeInMemoryRendezvousStore();
  RunRanks(size, [&](int rank) {
    auto group = GlooGroup::Create(*store, "dense", rank, size, Options(milliseconds(20000)));
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    for (const GatherCase& c : cases) {
      const int64_t elem = DTypeSize(c.dtype);
      const std::vector<uint8_t> full = MakeFull(c.shape, elem);
      const ChunkRange mine = TorchChunk(c.shape[c.dim], size, rank);
      const std::vector<uint8_t> shard = CutShard(full, c.shape, c.dim, mine.begin, mine.size, elem);
      std::vector<uint8_t> out(full.size(), 0xEE);
      Status s = (*group)->AllGatherShards(shard.empty() ? nullptr : shard.data(), out.data(),
                                           c.shape, c.dim, c.dtype);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(out, full) << "rank " << rank << " dim " << c.dim << " shape[0] " << c.shape[0];
    }
    Status b = (*group)->Barrier();
    EXPECT_TRUE(b.ok()) << b.ToString();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadRanksTest, ::testing::Values(2, 3, 4));

TEST(GlooGroupTest, GroupsOfDifferentMeshGroupsShareOneStore) {
  auto store = MakeInMemoryRendezvousStore();
  RunRanks(4, [&](int rank) {
    // Every rank is in "all"; ranks {0,1} and {2,3} also form "pair-a"/"pair-b".
    auto all = GlooGroup::Create(*store, "all", rank, 4, Options(milliseconds(20000)));
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    auto pair = GlooGroup::Create(*store, rank < 2 ? "pair-a" : "pair-b", rank % 2, 2,
                                  Options(milliseconds(20000)));
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    std::vector<int64_t> shape{2, 3};
    const std::vector<uint8_t> full = MakeFull(shape, 4);
    const std::vector<uint8_t> shard = CutShard(full, shape, 0, rank % 2, 1, 4);
    std::vector<uint8_t> out(full.size());
    ASSERT_TRUE((*pair)->AllGatherShards(shard.data(), out.data(), shape, 0, DType::kFP32).ok());
    EXPECT_EQ(out, full);
    EXPECT_TRUE((*all)->Barrier().ok());
  });
}

TEST(GlooGroupTest, GroupOfOneCopiesWithoutPeers) {
  auto store = MakeInMemoryRendezvousStore();
  auto group = GlooGroup::Create(*store, "solo", 0, 1, Options(milliseconds(1000)));
  ASSERT_TRUE(group.ok());
  std::vector<int64_t> shape{3, 4};
  const std::vector<uint8_t> full = MakeFull(shape, 2);
  std::vector<uint8_t> out(full.size());
  ASSERT_TRUE((*group)->AllGatherShards(full.data(), out.data(), shape, 1, DType::kBF16).ok());
  EXPECT_EQ(out, full);
  EXPECT_TRUE((*group)->Barrier().ok());
}

TEST(GlooGroupTest, RejectsBadArgumentsWithOneLine) {
  auto store = MakeInMemoryRendezvousStore();
  auto bad = GlooGroup::Create(*store, "g", 2, 2, Options(milliseconds(1000)));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto solo = GlooGroup::Create(*store, "solo", 0, 1, Options(milliseconds(1000)));
  ASSERT_TRUE(solo.ok());
  std::vector<int64_t> shape{3, 4};
  std::vector<uint8_t> buf(24);
  Status s = (*solo)->AllGatherShards(buf.data(), buf.data(), shape, 2, DType::kBF16);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("group 'solo'"), std::string::npos) << s.message();
}

TEST(GlooGroupTest, PeerThatNeverArrivesIsDeadlineExceeded) {
  auto store = MakeInMemoryRendezvousStore();
  const auto start = Clock::now();
  // Rank 1 of 2 never calls Create.
  auto group = GlooGroup::Create(*store, "lonely", 0, 2, Options(milliseconds(1000)));
  const auto elapsed = Clock::now() - start;
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), StatusCode::kDeadlineExceeded) << group.status().ToString();
  EXPECT_NE(group.status().message().find("group 'lonely' rank 0 of 2"), std::string::npos)
      << group.status().message();
  EXPECT_LT(elapsed, milliseconds(5000));
}

TEST(GlooGroupTest, PeerThatNeverArrivesAtAFileStoreIsDeadlineExceeded) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  auto store = MakeFileRendezvousStore(dir);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const auto start = Clock::now();
  auto group = GlooGroup::Create(**store, "lonely", 1, 3, Options(milliseconds(1000)));
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(group.status().code(), StatusCode::kDeadlineExceeded) << group.status().ToString();
  EXPECT_LT(elapsed, milliseconds(5000));  // gloo's FileStore polls in whole seconds
  std::filesystem::remove_all(dir);
}

TEST(GlooGroupTest, GathersInPlaceWhenTheShardLiesInsideTheOutput) {
  auto store = MakeInMemoryRendezvousStore();
  const std::vector<int64_t> shape{7, 3};
  RunRanks(3, [&](int rank) {
    auto group = GlooGroup::Create(*store, "inplace", rank, 3, Options(milliseconds(20000)));
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    const std::vector<uint8_t> full = MakeFull(shape, 4);
    const ChunkRange mine = TorchChunk(7, 3, rank);
    std::vector<uint8_t> out(full.size(), 0);
    std::memcpy(out.data() + mine.begin * 12, full.data() + mine.begin * 12, mine.size * 12);
    Status s = (*group)->AllGatherShards(out.data() + mine.begin * 12, out.data(), shape, 0,
                                         DType::kFP32);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(out, full);
  });
}

TEST(GlooGroupTest, PeerThatSkipsACollectiveIsDeadlineExceededAndPoisonsTheGroup) {
  auto store = MakeInMemoryRendezvousStore();
  std::atomic<bool> rank0_done{false};
  RunRanks(2, [&](int rank) {
    auto group = GlooGroup::Create(*store, "g", rank, 2, Options(milliseconds(1000)));
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    if (rank == 1) {
      // Alive and connected, but never joins the gather.
      while (!rank0_done) std::this_thread::sleep_for(milliseconds(10));
      return;
    }
    std::vector<int64_t> shape{4, 4};
    std::vector<uint8_t> shard(8 * 4), out(16 * 4);
    const auto start = Clock::now();
    Status s = (*group)->AllGatherShards(shard.data(), out.data(), shape, 0, DType::kFP32);
    const auto elapsed = Clock::now() - start;
    rank0_done = true;
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
    EXPECT_NE(s.message().find("gloo allgatherv (group 'g' rank 0 of 2)"), std::string::npos)
        << s.message();
    EXPECT_GE(elapsed, milliseconds(1000));
    EXPECT_LT(elapsed, milliseconds(5000));
    EXPECT_EQ((*group)->Barrier().code(), StatusCode::kFailedPrecondition);
  });
}

TEST(GlooGroupTest, FileStoreRejectsMissingDirectory) {
  auto store = MakeFileRendezvousStore("/nonexistent/wsync-rendezvous");
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("/nonexistent/wsync-rendezvous"), std::string::npos);
}

// Forks one process per rank; each runs body(rank) and exits with its result
// (0 = pass). Returns the exit codes, killing stragglers after `limit`.
std::vector<int> RunProcesses(int size, milliseconds limit, const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(body(r));
    pids.push_back(pid);
  }
  std::vector<int> codes(size, -1);
  const auto deadline = Clock::now() + limit;
  int left = size;
  while (left > 0) {
    for (int r = 0; r < size; ++r) {
      if (codes[r] != -1) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      } else if (Clock::now() > deadline) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &status, 0);
        codes[r] = 99;  // hung
        --left;
      }
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  return codes;
}

TEST(GlooProcessTest, ProcessesOverLoopbackTcpWithFileStore) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const int size = 3;
  const std::vector<int64_t> shape{5, 130};  // dim 1 chunks 44, 44, 42
  std::vector<int> codes = RunProcesses(size, milliseconds(60000), [&](int rank) {
    auto store = MakeFileRendezvousStore(dir);
    if (!store.ok()) return 2;
    auto group = GlooGroup::Create(**store, "experts", rank, size, Options(milliseconds(20000)));
    if (!group.ok()) {
      fprintf(stderr, "rank %d: %s\n", rank, group.status().ToString().c_str());
      return 3;
    }
    const std::vector<uint8_t> full = MakeFull(shape, 2);
    const ChunkRange mine = TorchChunk(shape[1], size, rank);
    const std::vector<uint8_t> shard = CutShard(full, shape, 1, mine.begin, mine.size, 2);
    std::vector<uint8_t> out(full.size());
    Status s = (*group)->AllGatherShards(shard.data(), out.data(), shape, 1, DType::kBF16);
    if (!s.ok()) {
      fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      return 4;
    }
    if (out != full) return 5;
    return (*group)->Barrier().ok() ? 0 : 6;
  });
  EXPECT_EQ(codes, std::vector<int>(size, 0));
  std::filesystem::remove_all(dir);
}

TEST(GlooProcessTest, PeerProcessThatDiesGivesAnErrorNotAHang) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const milliseconds timeout(3000);
  std::vector<int> codes = RunProcesses(2, milliseconds(30000), [&](int rank) {
    auto store = MakeFileRendezvousStore(dir);
    if (!store.ok()) return 2;
    auto group = GlooGroup::Create(**store, "dense", rank, 2, Options(timeout));
    if (!group.ok()) return 3;
    // Both ranks finish connecting before rank 1 dies: otherwise rank 0 may
    // still be inside Create when the peer goes (also an error, but not the
    // one this test is about).
    if (!(*group)->Barrier().ok()) return 7;
    if (rank == 1) _exit(0);  // dies right after connecting
    std::vector<int64_t> shape{1 << 20};
    std::vector<uint8_t> shard(1 << 20), out(2 << 20);
    const auto start = Clock::now();
    Status s = (*group)->AllGatherShards(shard.data(), out.data(), shape, 0, DType::kBF16);
    const auto elapsed = Clock::now() - start;
    fprintf(stderr, "rank 0 after peer death: %s\n", s.ToString().c_str());
    if (s.ok()) return 4;
    if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kDeadlineExceeded) return 5;
    return elapsed < timeout + milliseconds(3000) ? 0 : 6;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace wsync
