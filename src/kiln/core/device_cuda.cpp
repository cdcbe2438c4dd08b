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

namespace {
// cudaMalloc or cudaMallocHost of at least one byte, so that an empty tensor still has a unique
// pointer; a failure is a named error and leaves no sticky CUDA error behind.
template <class Alloc>
Expected<void*> allocate(const char* what, int64_t nbytes, Alloc alloc) {
  KILN_RETURN_IF_ERROR(check_available(what));
  KILN_CHECK(nbytes >= 0);
  void* p = nullptr;
  const cudaError_t err = alloc(&p, static_cast<size_t>(nbytes > 0 ? nbytes : 1));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return from_cuda(err, fmt::format("{}({} bytes)", what, nbytes).c_str());
  }
  return p;
}

// cudaFree, cudaFreeHost, cudaStreamDestroy or cudaEventDestroy of a handle (null: nothing); at
// process exit the runtime may be torn down before the last static owner: nothing to free then.
template <class Handle>
void release(Handle handle, cudaError_t (*free_fn)(Handle), const char* what) {
  if (handle == nullptr) return;
  const cudaError_t err = free_fn(handle);
  if (err == cudaErrorCudartUnloading) return;
  KILN_CHECK_MSG(err == cudaSuccess, "{}: {}", what, cudaGetErrorString(err));
}

// A synchronous copy in the order of this thread's current stream (StreamScope): queued behind
// the kernels already on it, and returned once the bytes have arrived. A plain cudaMemcpy would
// run on the legacy default stream, which does not wait for work on a non-blocking stream.
Status copy_in_stream_order(void* dst, const void* src, int64_t nbytes, cudaMemcpyKind kind,
                            const char* what) {
  const auto stream = static_cast<cudaStream_t>(current_stream());
  const cudaError_t err = cudaMemcpyAsync(dst, src, static_cast<size_t>(nbytes), kind, stream);
  return from_cuda(err != cudaSuccess ? err : cudaStreamSynchronize(stream), what);
}
}  // namespace

Expected<void*> malloc_device(int64_t nbytes) {
  return allocate("malloc_device", nbytes, [](void** p, size_t n) { return cudaMalloc(p, n); });
}

void free_device(void* ptr) {
  release(ptr, cudaFree, "cudaFree");
}

Status copy_host_to_device(void* dst, const void* src, int64_t nbytes) {
  KILN_RETURN_IF_ERROR(check_available("copy_host_to_device"));
  if (nbytes == 0) return {};
  return copy_in_stream_order(dst, src, nbytes, cudaMemcpyHostToDevice, "copy_host_to_device");
}

Status copy_device_to_host(void* dst, const void* src, int64_t nbytes) {
  KILN_RETURN_IF_ERROR(check_available("copy_device_to_host"));
  if (nbytes == 0) return {};
  return copy_in_stream_order(dst, src, nbytes, cudaMemcpyDeviceToHost, "copy_device_to_host");
}

Status copy_device_to_device(void* dst, const void* src, int64_t nbytes) {
  KILN_RETURN_IF_ERROR(check_available("copy_device_to_device"));
  if (nbytes == 0) return {};
  return copy_in_stream_order(dst, src, nbytes, cudaMemcpyDeviceToDevice, "copy_device_to_device");
}

Status memset_device(void* dst, int value, int64_t nbytes) {
  KILN_RETURN_IF_ERROR(check_available("memset_device"));
  if (nbytes == 0) return {};
  return from_cuda(cudaMemsetAsync(dst, value, static_cast<size_t>(nbytes),
                                   static_cast<cudaStream_t>(current_stream())),
                   "memset_device");
}

Status synchronize() {
  KILN_RETURN_IF_ERROR(check_available("synchronize"));
  return from_cuda(cudaDeviceSynchronize(), "synchronize");
}

// ---- streams, events, pinned memory, graphs ---------------------------------------------------
namespace {
cudaStream_t stream_of(const Stream& s) {
  return static_cast<cudaStream_t>(s.handle());
}
// A failed call's error is cleared so that the next runtime call starts clean.
Status checked(cudaError_t err, const char* what) {
  if (err != cudaSuccess) cudaGetLastError();
  return from_cuda(err, what);
}
}  // namespace

Expected<Stream> Stream::create() {
  KILN_RETURN_IF_ERROR(check_available("Stream::create"));
  cudaStream_t s = nullptr;
  KILN_RETURN_IF_ERROR(
      checked(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "Stream::create"));
  return Stream(s);
}

Stream::~Stream() {
  release(static_cast<cudaStream_t>(handle_), cudaStreamDestroy, "cudaStreamDestroy");
}

Status Stream::synchronize() const {
  KILN_RETURN_IF_ERROR(check_available("Stream::synchronize"));
  return checked(cudaStreamSynchronize(stream_of(*this)), "Stream::synchronize");
}

Expected<Event> Event::create() {
  KILN_RETURN_IF_ERROR(check_available("Event::create"));
  cudaEvent_t e = nullptr;
  KILN_RETURN_IF_ERROR(checked(cudaEventCreate(&e), "Event::create"));
  return Event(e);
}

Event::~Event() {
  release(static_cast<cudaEvent_t>(handle_), cudaEventDestroy, "cudaEventDestroy");
}

Status Event::record(const Stream& stream) {
  return checked(cudaEventRecord(static_cast<cudaEvent_t>(handle_), stream_of(stream)),
                 "Event::record");
}

Status Event::make_wait(const Stream& stream) const {
  return checked(cudaStreamWaitEvent(stream_of(stream), static_cast<cudaEvent_t>(handle_), 0),
                 "Event::make_wait");
}

Status Event::synchronize() const {
  return checked(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)), "Event::synchronize");
}

Expected<float> Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  KILN_RETURN_IF_ERROR(checked(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_),
                                                    static_cast<cudaEvent_t>(end.handle_)),
                               "Event::elapsed_ms"));
  return ms;
}

Expected<void*> malloc_pinned(int64_t nbytes) {
  return allocate("malloc_pinned", nbytes, [](void** p, size_t n) { return cudaMallocHost(p, n); });
}

void free_pinned(void* ptr) {
  release(ptr, cudaFreeHost, "cudaFreeHost");
}

Status copy_host_to_device_async(void* dst, const void* src, int64_t nbytes, const Stream& stream) {
  KILN_RETURN_IF_ERROR(check_available("copy_host_to_device_async"));
  if (nbytes == 0) return {};
  return checked(cudaMemcpyAsync(dst, src, static_cast<size_t>(nbytes), cudaMemcpyHostToDevice,
                                 stream_of(stream)),
                 "copy_host_to_device_async");
}

Status copy_device_to_host_async(void* dst, const void* src, int64_t nbytes, const Stream& stream) {
  KILN_RETURN_IF_ERROR(check_available("copy_device_to_host_async"));
  if (nbytes == 0) return {};
  return checked(cudaMemcpyAsync(dst, src, static_cast<size_t>(nbytes), cudaMemcpyDeviceToHost,
                                 stream_of(stream)),
                 "copy_device_to_host_async");
}

Expected<Graph> Graph::capture(const Stream& stream, const std::function<Status()>& record) {
  KILN_RETURN_IF_ERROR(check_available("Graph::capture"));
  if (stream.is_default())
    return invalid_argument(
        "Graph::capture: the default stream cannot be captured; capture on a Stream::create() "
        "stream");
  const cudaStream_t s = stream_of(stream);
  // Thread-local mode: only this thread's calls are captured, and an unsafe call (a synchronous
  // copy, a device-wide sync) from it fails the capture instead of silently running.
  KILN_RETURN_IF_ERROR(
      checked(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "Graph::capture"));
  Status recorded;
  {
    StreamScope scope(stream);
    recorded = record();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);  // always ended, even after a failure
  if (!recorded.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return recorded;
  }
  KILN_RETURN_IF_ERROR(checked(ended, "Graph::capture (end)"));
  Graph g;
  g.graph_ = graph;
  size_t nodes = 0;
  KILN_RETURN_IF_ERROR(
      checked(cudaGraphGetNodes(graph, nullptr, &nodes), "Graph::capture (nodes)"));
  g.nodes_ = static_cast<int64_t>(nodes);
  cudaGraphExec_t exec = nullptr;
  KILN_RETURN_IF_ERROR(
      checked(cudaGraphInstantiate(&exec, graph, 0), "Graph::capture (instantiate)"));
  g.exec_ = exec;
  return g;
}

Graph::~Graph() {
  // At process exit the runtime may already be gone (cudaErrorCudartUnloading): nothing to free.
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

Status Graph::launch(const Stream& stream) const {
  if (exec_ == nullptr)
    return failed_precondition("Graph::launch of a graph that was never captured");
  return checked(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream_of(stream)),
                 "Graph::launch");
}

}  // namespace kiln::cuda_runtime
