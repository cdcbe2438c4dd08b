// GGUF reader bounds: the files llama.cpp refuses and kiln used to read anyway (a repeated
// metadata key or tensor name, tensors that overlap or are out of order, over-long names), and
// counts that would make a small file allocate many times its size.
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/core/allocator.h"
#include "kiln/core/file_io.h"
#include "kiln/model/gguf.h"

namespace kiln {
namespace {

// A GGUF v3 image written by hand, so each field can be wrong on purpose.
struct Raw {
  std::string out;
  template <class T>
  void put(T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void str(std::string_view s) {
    put<uint64_t>(s.size());
    out.append(s);
  }
  void header(uint64_t tensors, uint64_t kvs) {
    put<uint32_t>(0x46554747);
    put<uint32_t>(3);
    put<uint64_t>(tensors);
    put<uint64_t>(kvs);
  }
  void kv_u32(std::string_view key, uint32_t v) {
    str(key);
    put<uint32_t>(4);  // U32
    put<uint32_t>(v);
  }
  void tensor_f32(std::string_view name, uint64_t n, uint64_t offset) {  // 1-D F32 of n elements
    str(name);
    put<uint32_t>(1);
    put<uint64_t>(n);
    put<uint32_t>(0);  // F32
    put<uint64_t>(offset);
  }
  void data(size_t bytes) {
    out.resize((out.size() + 31) / 32 * 32, '\0');  // the default alignment
    out.append(bytes, '\0');
  }
};

std::string two_tensors(std::string_view a, uint64_t off_a, std::string_view b, uint64_t off_b) {
  Raw r;
  r.header(2, 1);
  r.kv_u32("general.file_type", 0);
  r.tensor_f32(a, 8, off_a);  // 32 bytes each
  r.tensor_f32(b, 8, off_b);
  r.data(64);
  return r.out;
}

TEST(GgufBounds, WellFormedFileParses) {
  auto f = gguf::parse(two_tensors("a", 0, "b", 32));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->tensors.size(), 2u);
}

TEST(GgufBounds, RepeatedTensorNameIsRefused) {
  auto f = gguf::parse(two_tensors("a", 0, "a", 32));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("'a' appears twice"), std::string::npos) << f.status().message();
}

TEST(GgufBounds, RepeatedMetadataKeyIsRefused) {
  Raw r;
  r.header(0, 2);
  r.kv_u32("llama.block_count", 2);
  r.kv_u32("llama.block_count", 40);
  auto f = gguf::parse(r.out);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("appears twice"), std::string::npos) << f.status().message();
}

TEST(GgufBounds, OverlappingOrOutOfOrderTensorsAreRefused) {
  for (auto [off_a, off_b] : {std::pair<uint64_t, uint64_t>{0, 0}, {32, 0}, {0, 64}, {32, 32}}) {
    auto f = gguf::parse(two_tensors("a", off_a, "b", off_b));
    EXPECT_FALSE(f.ok()) << "offsets " << off_a << ", " << off_b;
  }
}

TEST(GgufBounds, OverLongTensorNameIsRefused) {
  EXPECT_TRUE(gguf::parse(two_tensors(std::string(63, 'x'), 0, "b", 32)).ok());
  EXPECT_FALSE(gguf::parse(two_tensors(std::string(64, 'x'), 0, "b", 32)).ok());
}

TEST(GgufBounds, HugeArrayCountIsRefusedBeforeAllocating) {
  // A u8 array claiming 2^25 elements in a 32 MiB file: within the bytes left, but 8x that in
  // memory as int64s.
  Raw r;
  r.header(0, 1);
  r.str("tokenizer.ggml.token_type");
  r.put<uint32_t>(9);  // array
  r.put<uint32_t>(0);  // of u8
  r.put<uint64_t>(uint64_t{1} << 25);
  r.out.append(size_t{1} << 25, '\1');
  auto f = gguf::parse(r.out);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("elements"), std::string::npos) << f.status().message();
}

TEST(GgufBounds, CountsAndSizesAtTheEdgeOfTheirTypes) {
  for (const uint64_t n : {uint64_t{1} << 63, ~uint64_t{0}, uint64_t{1} << 40}) {
    Raw tensors;
    tensors.header(n, 0);
    EXPECT_FALSE(gguf::parse(tensors.out).ok()) << n;
    Raw kvs;
    kvs.header(0, n);
    EXPECT_FALSE(gguf::parse(kvs.out).ok()) << n;
    Raw key;
    key.header(0, 1);
    key.put<uint64_t>(n);  // a key length
    EXPECT_FALSE(gguf::parse(key.out).ok()) << n;
    Raw dims;  // a dimension, and an offset, at the edge
    dims.header(1, 0);
    dims.str("t");
    dims.put<uint32_t>(2);
    dims.put<uint64_t>(n);
    dims.put<uint64_t>(n);
    dims.put<uint32_t>(0);
    dims.put<uint64_t>(0);
    dims.data(64);
    EXPECT_FALSE(gguf::parse(dims.out).ok()) << n;
    EXPECT_FALSE(gguf::parse(two_tensors("a", 0, "b", n)).ok()) << n;
  }
}

// Two files the GGUF fuzzer found (fuzz/): metadata that claims a 16,136-token vocabulary over an
// 8-token embedding made the loader allocate the whole model (6 GB, 26 s) before it read the
// tensor shapes; a token string that is not UTF-8 threw from the tokenizer.json it builds.
TEST(GgufBounds, FuzzerFindingsFailAtOnceOrLoad) {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/tests/reference/data/";
  auto huge = gguf::parse(read_file(dir + "gguf_claims_a_huge_vocab.gguf").value(), "huge");
  ASSERT_TRUE(huge.ok()) << huge.status().message();
  default_allocator().reset_peak();
  const int64_t before = default_allocator().stats().bytes_in_use;
  auto m = gguf::llama_from_gguf(*huge);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("token_embd.weight has dims [8, 32]"), std::string::npos) << m.status().message();
  EXPECT_LT(default_allocator().stats().peak_bytes_in_use - before, int64_t{64} << 20)
      << "the model was allocated before its tensors were checked";

  auto odd = gguf::parse(read_file(dir + "gguf_token_not_utf8.gguf").value(), "odd");
  ASSERT_TRUE(odd.ok()) << odd.status().message();
  auto loaded = gguf::llama_from_gguf(*odd);  // must not throw
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_TRUE(loaded->tokenizer_json.empty());
  EXPECT_NE(loaded->tokenizer_note.find("not UTF-8"), std::string::npos) << loaded->tokenizer_note;
}

}  // namespace
}  // namespace kiln
