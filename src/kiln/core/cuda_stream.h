// The stream the CUDA kernels launch on from this host thread: a cudaStream_t held as void* (null:
// the legacy default stream), set by core/device.h's StreamScope. A plain header (no fmt, no CUDA
// headers) so that both the host code and the .cu launchers (kernels/cuda/launchers.h) see one
// variable: an inline thread_local has a single definition across every object of the program.
#pragma once

namespace kiln::cuda_runtime {

inline thread_local void* tls_current_stream = nullptr;
inline void* current_stream() {
  return tls_current_stream;
}

}  // namespace kiln::cuda_runtime
