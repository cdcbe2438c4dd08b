// The host/device seam (core/device.h): device names, host storage unchanged, and the named
// errors of a build without CUDA or a machine without a GPU. Runs on every machine; the copies
// that need a device are in tests/cuda.
#include <gtest/gtest.h>

#include "kiln/core/device.h"
#include "kiln/core/tensor.h"

namespace kiln {
namespace {

TEST(Device, NamesRoundTrip) {
  EXPECT_EQ(device_name(Device::kHost), "host");
  EXPECT_EQ(device_name(Device::kCuda), "cuda");
  EXPECT_EQ(parse_device("cuda").value(), Device::kCuda);
  EXPECT_EQ(parse_device("host").value(), Device::kHost);
  EXPECT_EQ(parse_device("cpu").value(), Device::kHost);
  const auto bad = parse_device("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tpu"), std::string::npos);
}

TEST(Device, HostTensorsStayOnTheHost) {
  Tensor t = Tensor::full({2, 3}, 1.5f);
  EXPECT_EQ(t.device(), Device::kHost);
  EXPECT_EQ(t.storage()->device(), Device::kHost);
  EXPECT_EQ(t.to_string(), "Tensor(f32, (2, 3), strides (3, 1))");
  auto same = t.to(Device::kHost);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->raw_data(), t.raw_data());  // already there: itself, no copy
  auto host = Storage::allocate(64, Device::kHost);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ((*host)->device(), Device::kHost);
  EXPECT_EQ((*host)->nbytes(), 64);
}

TEST(Device, AvailabilityIsConsistent) {
  const bool built = cuda_runtime::built_with_cuda();
  const int count = cuda_runtime::device_count();
  EXPECT_GE(count, 0);
  EXPECT_EQ(cuda_available(), built && count > 0);
  if (!built) {
    EXPECT_EQ(count, 0);
  }
  if (cuda_available()) {
    EXPECT_TRUE(cuda_runtime::unavailable_reason().empty());
  } else {
    EXPECT_FALSE(cuda_runtime::unavailable_reason().empty());
  }
}

// Without CUDA (not built, or no device) every device path is a named error, never a crash.
TEST(Device, WithoutCudaTheErrorsSayWhatIsMissing) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (tests/cuda covers it)";
  const char* why = cuda_runtime::built_with_cuda() ? "no CUDA device" : "built without CUDA";
  auto storage = Storage::allocate(16, Device::kCuda);
  ASSERT_FALSE(storage.ok());
  EXPECT_NE(storage.status().message().find(why), std::string::npos)
      << storage.status().to_string();
  const Tensor t = Tensor::full({4}, 2.0f);
  auto moved = t.to(Device::kCuda);
  ASSERT_FALSE(moved.ok());
  EXPECT_NE(moved.status().message().find(why), std::string::npos) << moved.status().to_string();
  float host = 0;
  const Status copy = cuda_runtime::copy_host_to_device(&host, &host, 4);
  EXPECT_FALSE(copy.ok());
  EXPECT_NE(copy.message().find("copy_host_to_device"), std::string::npos);
  EXPECT_FALSE(cuda_runtime::synchronize().ok());
  EXPECT_FALSE(cuda_runtime::malloc_device(8).ok());
  cuda_runtime::free_device(nullptr);  // a no-op everywhere
}

TEST(Device, UndefinedTensorHasNoDevicePath) {
  const Tensor t;
  EXPECT_EQ(t.device(), Device::kHost);
  const auto r = t.to(Device::kCuda);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
