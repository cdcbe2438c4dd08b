// Where a tensor's bytes live (host memory or a CUDA device) and the small runtime interface
// core uses to allocate, free and copy device memory. The CUDA build implements it with the CUDA
// runtime (device_cuda.cpp); a build without CUDA answers every call with a named error
// (device_nocuda.cpp), so callers never #ifdef on the backend.
#pragma once

#include <cstdint>
#include <string_view>

#include "kiln/core/status.h"

namespace kiln {

enum class Device { kHost, kCuda };
std::string_view device_name(Device device);          // "host", "cuda"
Expected<Device> parse_device(std::string_view name);  // "host" | "cpu" | "cuda"

namespace cuda_runtime {

// True when this binary was built with the CUDA backend (whether or not a GPU is present).
bool built_with_cuda();
// Number of visible CUDA devices; 0 when not built, no driver or no device.
int device_count();
// built_with_cuda() and at least one device.
bool available();
// Why available() is false ("kiln was built without CUDA (-DKILN_CUDA=OFF)", "no CUDA device:
// ..."), empty when it is true.
std::string unavailable_reason();

// Device memory on the current device (device 0 unless changed by the CUDA runtime).
// nbytes = 0 gives a valid, unique, non-null pointer.
Expected<void*> malloc_device(int64_t nbytes);
void free_device(void* ptr);  // null is a no-op; an error here is a broken invariant (aborts)
// Synchronous copies (they return once the bytes have arrived).
Status copy_host_to_device(void* dst_device, const void* src_host, int64_t nbytes);
Status copy_device_to_host(void* dst_host, const void* src_device, int64_t nbytes);
Status copy_device_to_device(void* dst_device, const void* src_device, int64_t nbytes);
Status memset_device(void* dst_device, int value, int64_t nbytes);
// Waits for all work on the device; returns the first asynchronous kernel error, if any.
Status synchronize();

}  // namespace cuda_runtime

// Shorthand for the check every CUDA caller and test makes first.
inline bool cuda_available() { return cuda_runtime::available(); }

}  // namespace kiln
