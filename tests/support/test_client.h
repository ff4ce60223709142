#ifndef TESSERA_TESTS_SUPPORT_TEST_CLIENT_H_
#define TESSERA_TESTS_SUPPORT_TEST_CLIENT_H_

// A client of a test's cluster, with retries quick enough for a test: up to `max_retries`
// retries from 20 ms to 200 ms apart, each call given `deadline`. Null (and a failed
// expectation) when it cannot connect.

#include <chrono>
#include <memory>
#include <string>

#include "client/embedding_client.h"
#include "gtest/gtest.h"

namespace tessera::testing {

inline std::unique_ptr<client::EmbeddingClient> ConnectForTest(const std::string& coordinator,
                                                               client::ClientOptions::Mode mode,
                                                               std::chrono::milliseconds deadline,
                                                               int max_retries = 8) {
  client::ClientOptions o;
  o.mode = mode;
  o.deadline = deadline;
  o.retry.max_retries = max_retries;
  o.retry.initial_backoff = std::chrono::milliseconds(20);
  o.retry.max_backoff = std::chrono::milliseconds(200);
  auto c = client::EmbeddingClient::Connect(coordinator, o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Both client modes, for a test suite that runs each case through the smart client and
// through the coordinator (INSTANTIATE_TEST_SUITE_P(Modes, Suite, BothClientModes(),
// ClientModeName)); the mode names each case: .../Smart, .../Coordinator.
inline auto BothClientModes() {
  return ::testing::Values(client::ClientOptions::Mode::kSmart,
                           client::ClientOptions::Mode::kCoordinator);
}
inline std::string ClientModeName(
    const ::testing::TestParamInfo<client::ClientOptions::Mode>& info) {
  return info.param == client::ClientOptions::Mode::kSmart ? "Smart" : "Coordinator";
}

// Fixture's cases, each run once through each client mode (GetParam()) on a fresh fixture:
// TESSERA_IN_EACH_CLIENT_MODE below.
template <typename Fixture>
class InEachClientMode : public Fixture,
                         public ::testing::WithParamInterface<client::ClientOptions::Mode> {};

}  // namespace tessera::testing

// Declares test suite `Suite`: the TEST_P cases of Suite run on a fresh `Fixture` once
// through each client mode, named .../Smart and .../Coordinator.
#define TESSERA_IN_EACH_CLIENT_MODE(Suite, Fixture)                             \
  using Suite = ::tessera::testing::InEachClientMode<Fixture>;                  \
  INSTANTIATE_TEST_SUITE_P(Modes, Suite, ::tessera::testing::BothClientModes(), \
                           ::tessera::testing::ClientModeName)

#endif  // TESSERA_TESTS_SUPPORT_TEST_CLIENT_H_
