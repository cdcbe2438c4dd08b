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

// Streams, events, pinned memory and graphs without CUDA: each call names itself and what is
// missing; the default stream and an uncaptured graph need no device to exist.
TEST(Device, WithoutCudaStreamsEventsPinnedAndGraphsAreNamedErrors) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present (tests/cuda covers it)";
  const char* why = cuda_runtime::built_with_cuda() ? "no CUDA device" : "built without CUDA";
  const auto expect_named = [&](const Status& s, const char* call) {
    EXPECT_FALSE(s.ok()) << call;
    EXPECT_NE(s.message().find(call), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find(why), std::string::npos) << s.to_string();
  };
  expect_named(cuda_runtime::Stream::create().status(), "Stream::create");
  expect_named(cuda_runtime::Event::create().status(), "Event::create");
  expect_named(cuda_runtime::malloc_pinned(64).status(), "malloc_pinned");
  expect_named(cuda_runtime::PinnedBuffer::allocate(64).status(), "malloc_pinned");
  const cuda_runtime::Stream default_stream;
  EXPECT_TRUE(default_stream.is_default());
  EXPECT_EQ(default_stream.handle(), nullptr);
  expect_named(default_stream.synchronize(), "Stream::synchronize");
  float host[4] = {};
  expect_named(cuda_runtime::copy_host_to_device_async(host, host, 16, default_stream),
               "copy_host_to_device_async");
  expect_named(cuda_runtime::copy_device_to_host_async(host, host, 16, default_stream),
               "copy_device_to_host_async");
  bool recorded = false;
  const auto graph = cuda_runtime::Graph::capture(default_stream, [&] {
    recorded = true;
    return Status{};
  });
  expect_named(graph.status(), "Graph::capture");
  EXPECT_FALSE(recorded) << "nothing is recorded when there is nothing to capture on";
  const cuda_runtime::Graph never_captured;
  EXPECT_FALSE(never_captured.defined());
  const Status replay = never_captured.launch(default_stream);
  EXPECT_FALSE(replay.ok());
  EXPECT_NE(replay.message().find("Graph::launch"), std::string::npos) << replay.to_string();
  cuda_runtime::free_pinned(nullptr);  // a no-op everywhere
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
