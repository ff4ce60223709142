#include "trainer/data_parallel.h"

#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tessera::trainer {
namespace {

using std::chrono::milliseconds;

using MemoryKv = InProcessRendezvous;

DataParallelOptions Options(int rank, int n) {
  DataParallelOptions o;
  o.job = "job";
  o.num_workers = n;
  o.worker_index = rank;
  o.rendezvous_timeout = milliseconds(20000);
  o.timeout = milliseconds(10000);
  return o;
}

// Joins `n` workers of `job` on threads.
std::vector<std::unique_ptr<DataParallel>> JoinAll(MemoryKv* kv, int n,
                                                   milliseconds timeout = milliseconds(10000)) {
  std::vector<std::unique_ptr<DataParallel>> dps(n);
  std::vector<absl::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      DataParallelOptions o = Options(r, n);
      o.timeout = timeout;
      absl::StatusOr<std::unique_ptr<DataParallel>> dp = DataParallel::Join(kv, o);
      statuses[r] = dp.status();
      if (dp.ok()) dps[r] = *std::move(dp);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_TRUE(statuses[r].ok()) << statuses[r];
  return dps;
}

TEST(DataParallel, AllreduceMeanGivesEveryWorkerTheSameBitsOfTheMean) {
  MemoryKv kv;
  constexpr int kWorkers = 3;
  auto dps = JoinAll(&kv, kWorkers);
  ASSERT_EQ(dps.size(), static_cast<size_t>(kWorkers));
  // Values whose sum depends on the order it is taken in (float rounding), and more of
  // them than one segment of the ring.
  const size_t n = 100003;
  std::vector<std::vector<float>> v(kWorkers, std::vector<float>(n));
  for (int r = 0; r < kWorkers; ++r) {
    for (size_t i = 0; i < n; ++i) v[r][i] = 1.0f / static_cast<float>(1 + i + r * 7) + r * 1e4f;
  }
  const auto before = v;
  std::vector<absl::Status> st(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] { st[r] = dps[r]->AllreduceMean(absl::MakeSpan(v[r])); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorkers; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
  for (int r = 1; r < kWorkers; ++r) {
    EXPECT_EQ(0, std::memcmp(v[0].data(), v[r].data(), n * sizeof(float))) << "worker " << r;
  }
  for (size_t i = 0; i < n; i += 997) {
    const double mean = (double(before[0][i]) + before[1][i] + before[2][i]) / 3;
    EXPECT_NEAR(v[0][i], mean, 1e-3 + std::abs(mean) * 1e-6) << i;
  }
  EXPECT_EQ(dps[0]->allreduces(), 1);
}

TEST(DataParallel, AllGatherReturnsEveryWorkersValueInWorkerOrder) {
  MemoryKv kv;
  auto dps = JoinAll(&kv, 2);
  std::vector<absl::StatusOr<std::vector<std::string>>> got(2);
  std::thread t([&] { got[1] = dps[1]->AllGather("bb"); });
  got[0] = dps[0]->AllGather("aa");
  t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_EQ(*got[r], (std::vector<std::string>{"aa", "bb"}));
  }
}

TEST(DataParallel, AWorkerIndexTakenTwiceIsRefused) {
  MemoryKv kv;
  ASSERT_TRUE(kv.Add("tessera/job/job/joined", 0).ok());
  // Both say index 0: the second to claim it is told so, naming the index.
  absl::Status second;
  std::thread first([&] {
    DataParallelOptions o = Options(0, 2);
    o.rendezvous_timeout = milliseconds(300);
    (void)DataParallel::Join(&kv, o);
  });
  std::this_thread::sleep_for(milliseconds(50));
  DataParallelOptions o = Options(0, 2);
  o.rendezvous_timeout = milliseconds(300);
  second = DataParallel::Join(&kv, o).status();
  first.join();
  ASSERT_EQ(second.code(), absl::StatusCode::kInvalidArgument) << second;
  EXPECT_NE(second.message().find("--worker_index=0"), std::string::npos) << second;
}

TEST(DataParallel, AWorkerThatNeverJoinsIsNamed) {
  MemoryKv kv;
  DataParallelOptions o = Options(0, 3);
  o.rendezvous_timeout = milliseconds(200);
  absl::Status s = DataParallel::Join(&kv, o).status();
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("worker(s) 1, 2 of 3 did not join"), std::string::npos) << s;
}

TEST(DataParallel, AWorkerThatStopsIsNamedByTheOthersNextCollective) {
  MemoryKv kv;
  // A timeout far beyond the test's: what fails the allreduce is the closed connection.
  auto dps = JoinAll(&kv, 2, std::chrono::hours(1));
  dps[1].reset();  // worker 1 goes away: its connections close
  std::vector<float> v(1000, 1.0f);
  absl::Status s = dps[0]->AllreduceMean(absl::MakeSpan(v));
  ASSERT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("worker 1 has stopped or cannot be reached"), std::string::npos) << s;
}

TEST(DataParallel, ARestartedJobMeetsInANewGeneration) {
  MemoryKv kv;
  auto first = JoinAll(&kv, 2);
  EXPECT_EQ(first[0]->generation(), 0);
  first.clear();
  auto second = JoinAll(&kv, 2);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0]->generation(), 1);
  EXPECT_EQ(second[1]->generation(), 1);
  std::vector<float> a(10, 1.0f), b(10, 3.0f);
  absl::Status sb;
  std::thread t([&] { sb = second[1]->AllreduceMean(absl::MakeSpan(b)); });
  ASSERT_TRUE(second[0]->AllreduceMean(absl::MakeSpan(a)).ok());
  t.join();
  ASSERT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(a, std::vector<float>(10, 2.0f));
}

TEST(DataParallel, FingerprintSeesEveryBit) {
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  const uint64_t h = Fingerprint(v);
  v[1] = std::nextafter(v[1], 3.0f);
  EXPECT_NE(Fingerprint(v), h);
}

}  // namespace
}  // namespace tessera::trainer
