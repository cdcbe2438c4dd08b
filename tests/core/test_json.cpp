// parse_json: bounded depth and size before nlohmann's recursive parser runs (a body nested
// 100,000 deep overflowed the stack), brackets inside strings not counted, errors that name
// what was parsed; checked_math: sums and products at the edge of int64.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "kiln/core/checked_math.h"
#include "kiln/core/json.h"

namespace kiln {
namespace {

TEST(ParseJson, DepthIsBoundedBeforeParsing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto r = parse_json(deep, "the request body");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("the request body"), std::string::npos);
  EXPECT_NE(r.status().message().find("deeper than 64"), std::string::npos) << r.status().message();
  // Exactly at the limit parses; one more does not.
  const std::string at = std::string(64, '[') + std::string(64, ']');
  EXPECT_TRUE(parse_json(at, "x").ok());
  EXPECT_FALSE(parse_json("[" + at + "]", "x").ok());
  EXPECT_TRUE(parse_json("{\"a\": " + at + "}", "x", {.max_depth = 65}).ok());
}

TEST(ParseJson, BracketsInsideStringsDoNotCount) {
  const std::string s = "{\"k\": \"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"}";
  auto r = parse_json(s, "x");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)["k"].get<std::string>().size(), 2001u);
  EXPECT_EQ(json_depth("[\"]]]]\", [[1]]]", 100), 3);
}

TEST(ParseJson, SizeAndSyntaxErrorsNameWhat) {
  auto big = parse_json(std::string(100, ' ') + "1", "config.json", {.max_depth = 8, .max_bytes = 50});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("config.json"), std::string::npos);
  EXPECT_NE(big.status().message().find("limit of 50"), std::string::npos);
  for (const char* bad : {"", "{", "{\"a\": }", "[1, 2", "nul", "{\"a\": 1} x", "\"\\ud800\""}) {
    auto r = parse_json(bad, "tokenizer.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("tokenizer.json: not valid JSON"), std::string::npos) << r.status().message();
  }
}

TEST(CheckedMath, EdgesOfInt64) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(checked_add<int64_t>(kMax - 1, 1), kMax);
  EXPECT_FALSE(checked_add<int64_t>(kMax, 1));
  EXPECT_FALSE(checked_add<int64_t>(kMin, -1));
  EXPECT_FALSE(checked_mul<int64_t>(int64_t{1} << 32, int64_t{1} << 31));
  EXPECT_EQ(checked_mul<int64_t>(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  const std::vector<int64_t> ok = {1024, 1024, 1024}, wraps = {int64_t{1} << 40, int64_t{1} << 30},
                             negative = {4, -1};
  EXPECT_EQ(checked_numel_bytes(ok, 4), int64_t{4} << 30);
  EXPECT_FALSE(checked_numel_bytes(wraps, 4));
  EXPECT_FALSE(checked_numel_bytes(negative));
  EXPECT_EQ(checked_numel_bytes({}, 2), 2);
}

}  // namespace
}  // namespace kiln
