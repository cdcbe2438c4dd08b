// Device names and the backend-independent helpers; the runtime calls live in device_cuda.cpp (CUDA
// builds) or device_nocuda.cpp.
#include "kiln/core/device.h"

namespace kiln {

std::string_view device_name(Device device) {
  switch (device) {
    case Device::kHost:
      return "host";
    case Device::kCuda:
      return "cuda";
  }
  return "?";
}

Expected<Device> parse_device(std::string_view name) {
  if (name == "host" || name == "cpu") return Device::kHost;
  if (name == "cuda" || name == "gpu") return Device::kCuda;
  return invalid_argument("unknown device '{}' (expected host or cuda)", name);
}

namespace cuda_runtime {

Expected<PinnedBuffer> PinnedBuffer::allocate(int64_t nbytes) {
  KILN_ASSIGN_OR_RETURN(void* p, malloc_pinned(nbytes));
  PinnedBuffer b;
  b.data_ = p;
  b.nbytes_ = nbytes;
  return b;
}

}  // namespace cuda_runtime

}  // namespace kiln
