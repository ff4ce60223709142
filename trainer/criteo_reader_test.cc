#include "trainer/criteo_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::trainer {
namespace {

// A valid line: label, 13 ints (some empty), 26 hex (some empty).
std::string Line(int label, int seed) {
  std::string s = absl::StrCat(label);
  for (int i = 0; i < 13; ++i) {
    s += "\t";
    if ((i + seed) % 5 != 0) absl::StrAppend(&s, (i * 7 + seed) % 50 - 2);
  }
  for (int i = 0; i < 26; ++i) {
    s += "\t";
    if ((i + seed) % 7 != 0)
      absl::StrAppend(&s,
                      absl::Hex((i * 0x1f3d5b79u + seed * 977u) & 0xffffffffu, absl::kZeroPad8));
  }
  return s;
}

// Lines 0 .. n-1: labels alternating from 0, line i's features from seed i.
std::vector<std::string> Lines(int n) {
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) lines.push_back(Line(i % 2, i));
  return lines;
}

std::string WriteFile(const std::string& name, const std::vector<std::string>& lines) {
  const std::string path = absl::StrCat(testing::TempDir(), "/", name);
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
  return path;
}

TEST(ParseCriteoLine, AppliesLogToIntegersAndHashesCategoricalsPerFeature) {
  CriteoOptions o;
  std::string line = "1\t0\t3\t\t-5\t100";
  for (int i = 5; i < 13; ++i) line += "\t1";
  line += "\t68fd1e64\t\t68fd1e64";
  for (int i = 3; i < 26; ++i) line += "\tabcdef01";
  std::vector<float> dense(13);
  std::vector<int64_t> ids(26);
  float label = -1;
  ASSERT_TRUE(ParseCriteoLine(line, o, dense.data(), ids.data(), &label).ok());
  EXPECT_EQ(label, 1.0f);
  EXPECT_FLOAT_EQ(dense[0], 0.0f);
  EXPECT_FLOAT_EQ(dense[1], std::log(4.0f));
  EXPECT_FLOAT_EQ(dense[2], 0.0f);  // empty
  EXPECT_FLOAT_EQ(dense[3], 0.0f);  // negative clamps to 0
  EXPECT_FLOAT_EQ(dense[4], std::log(101.0f));
  EXPECT_EQ(ids[0], CriteoFeatureId(0, 0x68fd1e64, false));
  EXPECT_EQ(ids[1], CriteoFeatureId(1, 0, true));
  // The same value in another feature gets another id.
  EXPECT_NE(ids[0], ids[2]);
  EXPECT_NE(CriteoFeatureId(1, 0, true), CriteoFeatureId(1, 0, false));
}

// The lines and held-out line numbers of tests/data/criteo_golden.txt, which the Python
// package's reading (tessera.criteo, for scoring on a serving replica) checks too.
TEST(ParseCriteoLine, MatchesTheGoldenValuesThePythonReaderChecksToo) {
  std::ifstream in(TESSERA_SOURCE_DIR "/tests/data/criteo_golden.txt");
  ASSERT_TRUE(in.is_open());
  CriteoOptions o;
  std::vector<float> dense(13);
  std::vector<int64_t> ids(26);
  float label = 0;
  std::string text;
  int lines = 0, held_out_sets = 0;
  while (std::getline(in, text)) {
    if (text.empty() || text[0] == '#') continue;
    std::istringstream fields(text);
    std::string kind;
    fields >> kind;
    if (kind == "line") {
      std::string line = text.substr(5);
      std::replace(line.begin(), line.end(), '|', '\t');
      ASSERT_TRUE(ParseCriteoLine(line, o, dense.data(), ids.data(), &label).ok()) << line;
      ++lines;
    } else if (kind == "dense") {
      for (int i = 0; i < 13; ++i) {
        float want = 0;
        ASSERT_TRUE(fields >> want) << text;
        EXPECT_EQ(dense[i], want) << "line " << lines << " dense " << i;
      }
    } else if (kind == "ids") {
      for (int i = 0; i < 26; ++i) {
        int64_t want = 0;
        ASSERT_TRUE(fields >> want) << text;
        EXPECT_EQ(ids[i], want) << "line " << lines << " feature " << i;
      }
    } else if (kind == "held_out") {
      CriteoOptions split;
      fields >> split.seed >> split.held_out_fraction;
      std::vector<int64_t> want, got;
      for (int64_t n = 0; fields >> n;) want.push_back(n);
      for (int64_t n = 1; n <= 2000; ++n) {
        if (IsHeldOutLine(n, split)) got.push_back(n);
      }
      EXPECT_EQ(got, want) << "seed " << split.seed;
      ++held_out_sets;
    }
  }
  EXPECT_EQ(lines, 3);
  EXPECT_EQ(held_out_sets, 2);
}

TEST(ParseCriteoLine, ExplainsMalformedLines) {
  CriteoOptions o;
  std::vector<float> dense(13);
  std::vector<int64_t> ids(26);
  float label;
  auto why = [&](const std::string& l) {
    return std::string(ParseCriteoLine(l, o, dense.data(), ids.data(), &label).message());
  };
  std::string good = Line(0, 1);
  EXPECT_TRUE(ParseCriteoLine(good, o, dense.data(), ids.data(), &label).ok());
  EXPECT_TRUE(ParseCriteoLine(good + "\r", o, dense.data(), ids.data(), &label).ok());
  EXPECT_THAT(why("2" + good.substr(1)), testing::HasSubstr("label must be 0 or 1"));
  EXPECT_THAT(why(good + "\textra"), testing::HasSubstr("more than 40"));
  EXPECT_THAT(why(good.substr(0, good.rfind('\t'))), testing::HasSubstr("got 39"));
  std::string bad_int = good;
  bad_int.replace(bad_int.find('\t'), 1, "\tx");
  EXPECT_THAT(why(bad_int), testing::HasSubstr("I1 is not an integer"));
  std::string bad_hex = good.substr(0, good.rfind('\t')) + "\tzz";
  EXPECT_THAT(why(bad_hex), testing::HasSubstr("C26 is not hexadecimal"));
  EXPECT_THAT(why(""), testing::HasSubstr("label"));
}

TEST(ParseCriteoLine, AByteOrderMarkAndATrailingTabDoNotDropAValidLine) {
  CriteoOptions o;
  std::vector<float> dense(13), dense2(13);
  std::vector<int64_t> ids(26), ids2(26);
  float label = -1, label2 = -1;
  const std::string good = Line(1, 7);
  ASSERT_TRUE(ParseCriteoLine(good, o, dense.data(), ids.data(), &label).ok());
  for (const std::string& variant : {"\xEF\xBB\xBF" + good, good + "\t", good + "\t\r"}) {
    ASSERT_TRUE(ParseCriteoLine(variant, o, dense2.data(), ids2.data(), &label2).ok());
    EXPECT_EQ(label2, label);
    EXPECT_EQ(dense2, dense);
    EXPECT_EQ(ids2, ids);
  }
  // One empty column more is a trailing tab; two are a malformed line.
  EXPECT_FALSE(ParseCriteoLine(good + "\t\t", o, dense2.data(), ids2.data(), &label2).ok());
}

TEST(CriteoReader, SkipsAndCountsBadLinesOrStopsNamingTheLine) {
  std::vector<std::string> lines = Lines(30);
  lines[4] = "garbage";
  lines[17] = "1\tnot\tenough";
  const std::string path = WriteFile("skip.tsv", lines);

  CriteoOptions o;
  o.held_out_fraction = 0.0;
  auto r = CriteoReader::Open(path, o, 8);
  ASSERT_TRUE(r.ok()) << r.status();
  Batch b;
  int samples = 0, batches = 0;
  while (true) {
    auto more = (*r)->Next(&b);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    samples += b.size;
    ++batches;
    ASSERT_EQ(b.offsets[0].size(), static_cast<size_t>(b.size + 1));
  }
  EXPECT_EQ(samples, 28);
  EXPECT_EQ(batches, 4);
  EXPECT_EQ((*r)->bad_lines(), 2);
  EXPECT_EQ((*r)->lines_read(), 30);

  o.stop_on_bad_line = true;
  auto stop = CriteoReader::Open(path, o, 8);
  ASSERT_TRUE(stop.ok());
  absl::Status s = absl::OkStatus();
  while (s.ok()) {
    auto more = (*stop)->Next(&b);
    if (!more.ok())
      s = more.status();
    else if (!*more)
      break;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("skip.tsv:5:"));
}

TEST(CriteoReader, HeldOutSplitIsDisjointStableAndEpochsRepeat) {
  std::vector<std::string> lines = Lines(200);
  const std::string path = WriteFile("split.tsv", lines);
  CriteoOptions o;
  o.held_out_fraction = 0.25;
  o.epochs = 2;
  auto held = CriteoReader::LoadHeldOut(path, o);
  ASSERT_TRUE(held.ok());
  auto r = CriteoReader::Open(path, o, 64);
  ASSERT_TRUE(r.ok());
  Batch b;
  int train = 0;
  while (*(*r)->Next(&b)) train += b.size;
  EXPECT_EQ(train % 2, 0);
  EXPECT_EQ(train / 2 + held->size, 200) << "each line is either train or held out";
  EXPECT_NEAR(held->size, 50, 20);
  int expected_held = 0;
  for (int line = 1; line <= 200; ++line) expected_held += IsHeldOutLine(line, o);
  EXPECT_EQ(held->size, expected_held);
}

std::string WriteGzip(const std::string& name, const std::vector<std::string>& lines) {
  const std::string path = absl::StrCat(testing::TempDir(), "/", name);
  gzFile f = gzopen(path.c_str(), "wb");
  for (const auto& l : lines) gzprintf(f, "%s\n", l.c_str());
  gzclose(f);
  return path;
}

// Every training batch of `spec` concatenated: labels and each sample's first id.
std::vector<int64_t> ReadAll(const std::string& spec, const CriteoOptions& o) {
  auto r = CriteoReader::Open(spec, o, 16);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  std::vector<int64_t> out;
  Batch b;
  while (true) {
    auto more = (*r)->Next(&b);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    for (int i = 0; i < b.size; ++i) {
      out.push_back(static_cast<int64_t>(b.labels[i]));
      out.push_back(b.ids[0][i]);
    }
  }
  return out;
}

TEST(CriteoReader, ReadsGzipFilesLikeThePlainOnes) {
  std::vector<std::string> lines;
  for (int i = 0; i < 500; ++i) lines.push_back(Line(i % 3 == 0, i));
  CriteoOptions o;
  o.held_out_fraction = 0.2;
  const std::string plain = WriteFile("same.tsv", lines);
  const std::string gz = WriteGzip("same.tsv.gz", lines);
  const std::vector<int64_t> a = ReadAll(plain, o);
  EXPECT_EQ(a.size(), 2u * (500 - CriteoReader::LoadHeldOut(plain, o)->size));
  EXPECT_EQ(a, ReadAll(gz, o));
  EXPECT_EQ(CriteoReader::LoadHeldOut(gz, o)->labels, CriteoReader::LoadHeldOut(plain, o)->labels);
}

TEST(CriteoReader, DataParallelWorkersSplitTheTrainingLinesByLineNumber) {
  std::vector<std::string> lines = Lines(301);
  const std::string path = WriteFile("workers.tsv", lines);
  CriteoOptions o;
  o.held_out_fraction = 0.2;
  const std::vector<int64_t> all = ReadAll(path, o);  // (label, first id) per sample
  std::vector<std::vector<int64_t>> parts(3);
  for (int w = 0; w < 3; ++w) {
    CriteoOptions ow = o;
    ow.num_workers = 3;
    ow.worker_index = w;
    parts[w] = ReadAll(path, ow);
    // Every worker holds out the same lines.
    auto held = CriteoReader::LoadHeldOut(path, ow);
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(held->labels, CriteoReader::LoadHeldOut(path, o)->labels);
  }
  // Worker w has the training lines whose line number is w + 1 modulo 3, in file order:
  // sample k of the whole goes to the worker of its line.
  std::vector<int64_t> merged;
  std::vector<size_t> at(3, 0);
  int line = 0;
  for (size_t k = 0; k < all.size(); k += 2) {
    // The line of training sample k/2: the next line that is not held out.
    while (IsHeldOutLine(line + 1, o)) ++line;
    const int w = line % 3;
    ASSERT_LT(at[w] + 1, parts[w].size() + 1);
    EXPECT_EQ(parts[w][at[w]], all[k]);
    EXPECT_EQ(parts[w][at[w] + 1], all[k + 1]);
    at[w] += 2;
    ++line;
  }
  for (int w = 0; w < 3; ++w) EXPECT_EQ(at[w], parts[w].size()) << "worker " << w;
  EXPECT_GT(parts[0].size(), 0u);
  EXPECT_GT(parts[2].size(), 0u);
}

TEST(CriteoReader, ReadsSeveralFilesInOrderNamingEachFilesOwnLines) {
  std::vector<std::string> first, second;
  for (int i = 0; i < 40; ++i) first.push_back(Line(1, i));
  for (int i = 0; i < 30; ++i) second.push_back(Line(0, 100 + i));
  second[2] = "broken";
  const std::string a = WriteFile("part-0.tsv", first);
  const std::string b = WriteGzip("part-1.tsv.gz", second);
  CriteoOptions o;
  o.held_out_fraction = 0.0;
  o.epochs = 2;
  auto r = CriteoReader::Open(absl::StrCat(a, ",", b), o, 16);
  ASSERT_TRUE(r.ok()) << r.status();
  Batch batch;
  std::vector<float> labels;
  while (*(*r)->Next(&batch)) labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  ASSERT_EQ(labels.size(), 2u * (40 + 29));
  EXPECT_EQ(labels[0], 1.0f);
  EXPECT_EQ(labels[40], 0.0f);  // the second file follows the first
  EXPECT_EQ(labels[69], 1.0f);  // and the second epoch starts at the first again
  EXPECT_EQ((*r)->bad_lines(), 2);

  // A glob names them too, sorted.
  auto globbed = CriteoReader::Open(absl::StrCat(testing::TempDir(), "/part-*.ts*"), o, 16);
  ASSERT_TRUE(globbed.ok()) << globbed.status();
  EXPECT_EQ((*globbed)->paths(), (std::vector<std::string>{a, b}));
  EXPECT_EQ(CriteoReader::Open(absl::StrCat(testing::TempDir(), "/nothing-*.tsv"), o, 16)
                .status()
                .code(),
            absl::StatusCode::kNotFound);

  o.stop_on_bad_line = true;
  auto stop = CriteoReader::Open(absl::StrCat(a, ",", b), o, 16);
  absl::Status s;
  while (s.ok()) {
    auto more = (*stop)->Next(&batch);
    if (!more.ok()) s = more.status();
    if (more.ok() && !*more) break;
  }
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("part-1.tsv.gz:3:"));
}

TEST(CriteoReader, ATruncatedGzipIsDataLossNotAShortFile) {
  std::vector<std::string> lines = Lines(3000);
  const std::string gz = WriteGzip("cut.tsv.gz", lines);
  std::string bytes;
  {
    std::ifstream in(gz, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  {
    std::ofstream out(gz, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size() / 2);
  }
  CriteoOptions o;
  auto r = CriteoReader::Open(gz, o, 64);
  ASSERT_TRUE(r.ok());
  Batch b;
  absl::Status s;
  for (int i = 0; i < 1000 && s.ok(); ++i) {
    auto more = (*r)->Next(&b);
    if (!more.ok()) s = more.status();
    if (more.ok() && !*more) break;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), testing::HasSubstr("corrupt or truncated"));
}

TEST(CriteoReader, StoppingHeldOutPassNamesTheFirstBadLineOfEitherSplit) {
  CriteoOptions o;
  o.held_out_fraction = 0.3;
  o.stop_on_bad_line = true;
  int train_line = 0, held_line = 0;  // 1-based: a training line, then a later held-out one
  for (int line = 1; line <= 100 && held_line == 0; ++line) {
    if (!IsHeldOutLine(line, o) && train_line == 0) train_line = line;
    if (IsHeldOutLine(line, o) && train_line != 0) held_line = line;
  }
  ASSERT_GT(held_line, train_line);
  std::vector<std::string> lines = Lines(100);
  lines[train_line - 1] = "bad training line";
  lines[held_line - 1] = "bad held-out line";
  const std::string path = WriteFile("first-bad.tsv", lines);
  auto held = CriteoReader::LoadHeldOut(path, o);
  ASSERT_FALSE(held.ok());
  EXPECT_THAT(std::string(held.status().message()),
              testing::HasSubstr(absl::StrCat("first-bad.tsv:", train_line, ":")));

  // Skipping, the held-out pass counts its own bad lines and reports none.
  o.stop_on_bad_line = false;
  HeldOutReport report;
  held = CriteoReader::LoadHeldOut(path, o, &report);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(report.bad_lines, 1);
  EXPECT_EQ(report.lines_read, held->size + 1);
}

TEST(CriteoReader, AnOverlongLineIsMalformedAndTheNextOneReads) {
  std::vector<std::string> lines = {Line(1, 1), std::string(3 << 20, '7'), Line(0, 2)};
  const std::string path = WriteFile("long.tsv", lines);
  CriteoOptions o;
  o.held_out_fraction = 0.0;
  const std::vector<int64_t> got = ReadAll(path, o);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[2], 0);
}

TEST(CriteoReader, MissingFileIsNotFound) {
  EXPECT_EQ(CriteoReader::Open("/nonexistent/x.tsv", CriteoOptions(), 4).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera::trainer
