// The device runtime of a CUDA build: the CUDA runtime API (cudart). Compiled only with the
// backend (KILN_CUDA); device_nocuda.cpp stands in for it otherwise.
#include <cuda_runtime_api.h>

#include "kiln/core/device.h"

namespace kiln::cuda_runtime {
namespace {
Status from_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  const StatusCode code = err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted
                          : err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver
                              ? StatusCode::kUnavailable
                              : StatusCode::kInternal;
  return {code, fmt::format("{}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err))};
}

// The device count, asked once: the first call initialises the runtime (slow), and a machine
// without a driver answers with an error that we keep as the reason.
struct Probe {
  int count = 0;
  std::string reason;
};
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    const cudaError_t err = cudaGetDeviceCount(&r.count);
    if (err != cudaSuccess) {
      r.count = 0;
      r.reason =
          fmt::format("no CUDA device: {} ({})", cudaGetErrorString(err), cudaGetErrorName(err));
      cudaGetLastError();  // clear it, so that later runtime calls start clean
    } else if (r.count == 0) {
      r.reason = "no CUDA device: cudaGetDeviceCount found 0";
    }
    return r;
  }();
  return p;
}

Status check_available(const char* what) {
  if (available()) return {};
  return {StatusCode::kUnavailable, fmt::format("{}: {}", what, probe().reason)};
}
}  // namespace

bool built_with_cuda() {
  return true;
}
int device_count() {
  return probe().count;
}
bool available() {
  return probe().count > 0;
}
std::string unavailable_reason() {
  return probe().reason;
}

Expected<void*> malloc_device(int64_t nbytes) {
  KILN_RETURN_IF_ERROR(check_available("malloc_device"));
  KILN_CHECK(nbytes >= 0);
  void* p = nullptr;
  // At least one byte, so that an empty tensor still has a unique pointer.
  const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(nbytes > 0 ? nbytes : 1));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return from_cuda(err, fmt::format("malloc_device({} bytes)", nbytes).c_str());
  }
  return p;
}

void free_device(void* ptr) {
  if (ptr == nullptr) return;
  const cudaError_t err = cudaFree(ptr);
  // At process exit the runtime may be torn down before the last static tensor: nothing to free.
  if (err == cudaErrorCudartUnloading) return;
  KILN_CHECK_MSG(err == cudaSuccess, "cudaFree: {}", cudaGetErrorString(err));
}

Status copy_host_to_device(void* dst, const void* src, int64_t nbytes) {
  KILN_RETURN_IF_ERROR(check_available("copy_host_to_device"));
  if (nbytes == 0) return {};
  return from_cuda(cudaMemcpy(dst, src, static_cast<size_t>(nbytes), cudaMemcpyHostToDevice),
                   "copy_host_to_device");
}

Status copy_device_to_host(void* dst, const void* src, int64_t nbytes) {
  KILN_RETURN_IF_ERROR(check_available("copy_device_to_host"));
  if (nbytes == 0) return {};
  return from_cuda(cudaMemcpy(dst, src, static_cast<size_t>(nbytes), cudaMemcpyDeviceToHost),
                   "copy_device_to_host");
}

Status copy_device_to_device(void* dst, const void* src, int64_t nbytes) {
  KILN_RETURN_IF_ERROR(check_available("copy_device_to_device"));
  if (nbytes == 0) return {};
  return from_cuda(cudaMemcpy(dst, src, static_cast<size_t>(nbytes), cudaMemcpyDeviceToDevice),
                   "copy_device_to_device");
}

Status memset_device(void* dst, int value, int64_t nbytes) {
  KILN_RETURN_IF_ERROR(check_available("memset_device"));
  if (nbytes == 0) return {};
  return from_cuda(cudaMemset(dst, value, static_cast<size_t>(nbytes)), "memset_device");
}

Status synchronize() {
  KILN_RETURN_IF_ERROR(check_available("synchronize"));
  return from_cuda(cudaDeviceSynchronize(), "synchronize");
}

}  // namespace kiln::cuda_runtime
