// Tensor: views share storage and index correctly; illegal views and shapes are errors that
// name the op and the shapes; copies convert between float dtypes.
#include <gtest/gtest.h>

#include <numeric>

#include "kiln/core/allocator.h"
#include "kiln/core/tensor.h"

namespace kiln {
namespace {

Tensor arange(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_floats(shape, v).value();
}

TEST(Tensor, ContiguousBasics) {
  Tensor t = arange({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.strides(), Shape({12, 4, 1}));
  EXPECT_EQ(t.get({1, 2, 3}), 23.0f);
  EXPECT_EQ(t.shape().to_string(), "(2, 3, 4)");
}

TEST(Tensor, SliceSelectTransposeShareStorage) {
  Tensor t = arange({4, 5});
  Tensor s = t.slice(1, 1, 4).value();  // (4, 3)
  EXPECT_EQ(s.shape(), Shape({4, 3}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.get({2, 0}), 11.0f);
  s.set({2, 0}, -1.0f);
  EXPECT_EQ(t.get({2, 1}), -1.0f);  // shared
  Tensor tr = t.transpose(0, 1).value();  // (5, 4)
  EXPECT_EQ(tr.get({3, 1}), t.get({1, 3}));
  Tensor row = t.select(0, 3).value();
  EXPECT_EQ(row.shape(), Shape({5}));
  EXPECT_EQ(row.get({4}), 19.0f);
  std::vector<float> c = tr.contiguous().to_floats();
  EXPECT_EQ(c[1], t.get({1, 0}));
}

TEST(Tensor, ViewAndReshape) {
  Tensor t = arange({2, 3, 4});
  Tensor v = t.view({6, -1}).value();
  EXPECT_EQ(v.shape(), Shape({6, 4}));
  EXPECT_EQ(v.get({5, 3}), 23.0f);
  // A transposed tensor can merge dims that stay contiguous among themselves...
  Tensor p = arange({4, 2, 3}).transpose(0, 2).value();  // (3, 2, 4), strides (1, 3, 6)
  EXPECT_FALSE(p.view({6, 4}).ok());
  Tensor q = arange({2, 3, 4}).slice(0, 0, 2).value().transpose(0, 1).value();  // (3, 2, 4)
  // ...dims 1,2 have strides (12, 1): not mergeable.
  auto bad = q.view({3, 8});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[view]"), std::string::npos);
  // Splitting a dim of a strided tensor is always legal.
  Tensor sp = p.view({3, 2, 2, 2}).value();
  EXPECT_EQ(sp.get({2, 1, 1, 0}), p.get({2, 1, 2}));
  // reshape copies when a view is illegal, and values follow logical order.
  Tensor r = q.reshape({3, 8}).value();
  EXPECT_TRUE(r.is_contiguous());
  std::vector<float> expect = q.to_floats();
  EXPECT_EQ(r.to_floats(), expect);
}

TEST(Tensor, ErrorsNameTheOpAndShapes) {
  Tensor t = arange({2, 3});
  auto e1 = t.view({4, 2});
  ASSERT_FALSE(e1.ok());
  EXPECT_EQ(e1.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e1.status().message().find("(2, 3)"), std::string::npos);
  EXPECT_NE(e1.status().message().find("(4, 2)"), std::string::npos);
  auto e2 = t.slice(1, 2, 5);
  ASSERT_FALSE(e2.ok());
  EXPECT_EQ(e2.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(e2.status().message().find("[slice]"), std::string::npos);
  EXPECT_FALSE(t.transpose(0, 2).ok());
  EXPECT_FALSE(t.view({-1, -1}).ok());
  EXPECT_FALSE(Tensor::from_floats({2, 2}, std::vector<float>(3)).ok());
  Tensor other = Tensor::zeros({3, 2});
  EXPECT_FALSE(t.copy_from(other).ok());
}

TEST(Tensor, DtypeConversionCopies) {
  Tensor t = Tensor::from_floats({3}, std::vector<float>{1.0f, 1.00390625f, 65504.0f}).value();
  Tensor b = t.to(DType::kBF16).value();
  EXPECT_EQ(b.get({1}), 1.0f);  // 1 + 2^-8 is a tie in bf16: rounds to even (1.0)
  Tensor h = t.to(DType::kF16).value();
  EXPECT_EQ(h.get({2}), 65504.0f);
  EXPECT_EQ(h.nbytes(), 6);
  EXPECT_FALSE(t.to(DType::kI4).ok());
}

TEST(Allocator, CachesAndReportsPeak) {
  CachingAllocator a;
  void* p = a.allocate(1000);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.bytes_requested, 1000);
  EXPECT_EQ(s.bytes_in_use, 1024);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % CachingAllocator::kAlignment, 0u);
  a.deallocate(p);
  void* q = a.allocate(900);  // same size class: reused, no OS allocation
  s = a.stats();
  EXPECT_EQ(q, p);
  EXPECT_EQ(s.num_os_allocs, 1);
  EXPECT_EQ(s.peak_bytes_in_use, 1024);
  void* big = a.allocate(3 << 20);
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 1024 + (3 << 20));
  a.deallocate(big);
  a.deallocate(q);
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_EQ(s.bytes_cached, 1024 + (3 << 20));
  a.empty_cache();
  EXPECT_EQ(a.stats().bytes_reserved, 0);
}

}  // namespace
}  // namespace kiln
