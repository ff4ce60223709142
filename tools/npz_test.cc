#include "tools/npz.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::tools {
namespace {

NpyArray Floats(std::vector<int64_t> shape, const std::vector<float>& v) {
  NpyArray a;
  a.dtype = "<f4";
  a.shape = std::move(shape);
  a.data.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return a;
}

NpyArray Ints(const std::vector<int64_t>& v) {
  NpyArray a;
  a.dtype = "<i8";
  a.shape = {static_cast<int64_t>(v.size())};
  a.data.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  return a;
}

// The values of array `name`, `a`, which must be of NumPy type `dtype` (T's).
template <typename T>
std::vector<T> ValuesOf(const std::string& name, const NpyArray& a, const std::string& dtype) {
  EXPECT_EQ(a.dtype, dtype) << name;
  std::vector<T> v(a.data.size() / sizeof(T));
  std::memcpy(v.data(), a.data.data(), a.data.size());
  return v;
}

TEST(Npz, WrittenArraysReadBackAsTheyWere) {
  const std::string path = absl::StrCat(testing::TempDir(), "/rows.npz");
  std::map<std::string, NpyArray> arrays = {
      {"ids", Ints({5, -1, 1LL << 62})},
      {"weights", Floats({3, 2}, {1.5f, -2, 0, 3.25f, 7, 8})},
      {"empty", Ints({})}};
  ASSERT_TRUE(WriteNpz(path, arrays).ok());
  auto read = ReadNpz(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 3u);
  for (const auto& [name, a] : arrays) {
    EXPECT_EQ((*read)[name].dtype, a.dtype) << name;
    EXPECT_EQ((*read)[name].shape, a.shape) << name;
    EXPECT_EQ((*read)[name].data, a.data) << name;
  }
}

// NumPy itself reads ours and writes what we read (np.savez: zip64 entries), when the
// system Python has numpy (python3-numpy, installed by setup.sh).
TEST(Npz, NumpyReadsOursAndWeReadNumpys) {
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
    GTEST_SKIP() << "no numpy for /usr/bin/python3";
  }
  const std::string ours = absl::StrCat(testing::TempDir(), "/ours.npz");
  const std::string theirs = absl::StrCat(testing::TempDir(), "/theirs.npz");
  ASSERT_TRUE(WriteNpz(ours, {{"ids", Ints({3, 4})}, {"weights", Floats({2, 1}, {0.5f, 9})}}).ok());
  const std::string script = absl::StrCat(
      "/usr/bin/python3 -c \"import numpy as np; z = np.load('", ours, "'); "
      "assert z['ids'].tolist() == [3, 4] and z['weights'].shape == (2, 1), dict(z); "
      "np.savez('", theirs, "', ids=np.array([2**64 - 1, 7], np.uint64), "
      "weights=np.arange(6, dtype=np.float32).reshape(3, 2))\"");
  ASSERT_EQ(std::system(script.c_str()), 0);
  auto read = ReadNpz(theirs);
  ASSERT_TRUE(read.ok()) << read.status();
  int64_t ids[2];
  ASSERT_EQ((*read)["ids"].data.size(), sizeof(ids));
  std::memcpy(ids, (*read)["ids"].data.data(), sizeof(ids));
  EXPECT_EQ(ids[0], -1);  // uint64 2**64-1: the same 64 bits
  EXPECT_EQ(ids[1], 7);
  EXPECT_EQ((*read)["weights"].shape, (std::vector<int64_t>{3, 2}));
}

// What the Python client accepts, the CLI's import reads: ids of any integer width and
// float64 or float16 weights (issue 25, item 14).
TEST(Npz, IntegersOfAnyWidthReadAsInt64AndFloatsAsFloat32) {
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
    GTEST_SKIP() << "no numpy for /usr/bin/python3";
  }
  const std::string path = absl::StrCat(testing::TempDir(), "/widths.npz");
  const std::string script = absl::StrCat(
      "/usr/bin/python3 -c \"import numpy as np; np.savez('", path, "', "
      "i32=np.array([-3, 2**31 - 1], np.int32), u16=np.array([65535, 1], np.uint16), "
      "i8=np.array([-128, 5], np.int8), "
      "f64=np.array([[0.1, -2.5e38], [1e-3, 3]], np.float64), "
      "f16=np.array([1.5, -3e-5, 65504], np.float16))\"");
  ASSERT_EQ(std::system(script.c_str()), 0);
  auto read = ReadNpz(path);
  ASSERT_TRUE(read.ok()) << read.status();
  auto ints = [&](const std::string& name) {
    return ValuesOf<int64_t>(name, (*read)[name], "<i8");
  };
  auto floats = [&](const std::string& name) {
    return ValuesOf<float>(name, (*read)[name], "<f4");
  };
  EXPECT_EQ(ints("i32"), (std::vector<int64_t>{-3, 2147483647}));
  EXPECT_EQ(ints("u16"), (std::vector<int64_t>{65535, 1}));
  EXPECT_EQ(ints("i8"), (std::vector<int64_t>{-128, 5}));
  EXPECT_EQ(floats("f64"), (std::vector<float>{0.1f, -2.5e38f, 1e-3f, 3.0f}));
  EXPECT_EQ((*read)["f64"].shape, (std::vector<int64_t>{2, 2}));
  const std::vector<float> half = floats("f16");
  ASSERT_EQ(half.size(), 3u);
  EXPECT_EQ(half[0], 1.5f);
  EXPECT_NEAR(half[1], -3e-5f, 6e-8f);  // a subnormal float16
  EXPECT_EQ(half[2], 65504.0f);
}

TEST(Npz, CompressedTruncatedOrMissingFilesAreClearErrors) {
  EXPECT_EQ(ReadNpz("/nonexistent.npz").status().code(), absl::StatusCode::kNotFound);
  const std::string path = absl::StrCat(testing::TempDir(), "/cut.npz");
  ASSERT_TRUE(WriteNpz(path, {{"ids", Ints({1, 2, 3})}}).ok());
  std::filesystem::resize_file(path, 40);
  EXPECT_EQ(ReadNpz(path).status().code(), absl::StatusCode::kInvalidArgument);
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") == 0) {
    const std::string z = absl::StrCat(testing::TempDir(), "/z.npz");
    ASSERT_EQ(std::system(absl::StrCat("/usr/bin/python3 -c \"import numpy as np; "
                                       "np.savez_compressed('", z, "', ids=np.arange(3))\"")
                              .c_str()),
              0);
    auto r = ReadNpz(z);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), testing::HasSubstr("np.savez_compressed"));
  }
}

}  // namespace
}  // namespace tessera::tools
