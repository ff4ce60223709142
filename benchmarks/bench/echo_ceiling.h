#ifndef TESSERA_BENCHMARKS_BENCH_ECHO_CEILING_H_
#define TESSERA_BENCHMARKS_BENCH_ECHO_CEILING_H_

#include <cstdint>

namespace tessera::bench {

// The transport ceiling, measured on 127.0.0.1 with a gRPC echo server in this process:
// bytes/s of calls sending `sent` and receiving `received` bytes, as unary calls and as
// request/response pairs on one bidirectional stream (about `seconds` each).
struct EchoCeiling {
  double unary_bytes_per_s = 0;
  double stream_bytes_per_s = 0;
};
EchoCeiling MeasureEcho(int64_t sent, int64_t received, double seconds = 0.5);

}  // namespace tessera::bench

#endif  // TESSERA_BENCHMARKS_BENCH_ECHO_CEILING_H_
