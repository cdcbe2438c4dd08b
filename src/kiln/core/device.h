// Where a tensor's bytes live (host memory or a CUDA device) and the small runtime interface
// core uses to allocate, free and copy device memory, and to order and time device work: streams,
// events, pinned host memory and CUDA graphs. The CUDA build implements it with the CUDA runtime
// (device_cuda.cpp); a build without CUDA answers every call with a named error
// (device_nocuda.cpp), so callers never #ifdef on the backend.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>

#include "kiln/core/cuda_stream.h"
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
// Synchronous copies (they return once the bytes have arrived), queued in the order of this
// thread's current stream (StreamScope) so they see the kernels already on it. memset_device is
// queued on that stream too and does not wait.
Status copy_host_to_device(void* dst_device, const void* src_host, int64_t nbytes);
Status copy_device_to_host(void* dst_host, const void* src_device, int64_t nbytes);
Status copy_device_to_device(void* dst_device, const void* src_device, int64_t nbytes);
Status memset_device(void* dst_device, int value, int64_t nbytes);
// Waits for all work on the device; returns the first asynchronous kernel error, if any.
Status synchronize();

// ---- streams, events, pinned memory, graphs ---------------------------------------------------
// A CUDA stream is an in-order queue of device work: a launch or an async copy returns to the
// host at once and the GPU runs the stream's work in the order it was queued; work on two
// streams may overlap (a copy beside a kernel). The default-constructed Stream is the legacy
// default stream, which waits for and blocks every other blocking stream; create() makes a
// non-blocking one.
class Stream {
 public:
  Stream() = default;
  static Expected<Stream> create();
  ~Stream();
  Stream(Stream&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  Stream& operator=(Stream&& other) noexcept {
    std::swap(handle_, other.handle_);  // other frees what this held
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void* handle() const { return handle_; }  // the cudaStream_t; null for the default stream
  bool is_default() const { return handle_ == nullptr; }
  // Host waits for this stream's queued work (a host-device sync); the first asynchronous error.
  Status synchronize() const;

 private:
  explicit Stream(void* handle) : handle_(handle) {}
  void* handle_ = nullptr;
};

// Sets the stream the kernels of kernels/cuda launch on from this host thread for the scope's
// life (cuda_stream.h), restoring the previous one after: the way a caller puts a sequence of
// kernel calls on its own stream without a stream argument in every kernel's signature.
class StreamScope {
 public:
  explicit StreamScope(const Stream& stream) : previous_(current_stream()) {
    tls_current_stream = stream.handle();
  }
  ~StreamScope() { tls_current_stream = previous_; }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  void* previous_;
};

// A marker in a stream: recorded when the GPU reaches it. Events time device work (the host
// clock would time only the queueing) and order streams against each other without the host.
class Event {
 public:
  static Expected<Event> create();
  ~Event();
  Event(Event&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  Event& operator=(Event&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Status record(const Stream& stream);
  // `stream`'s later work waits on the GPU until this event has been reached; the host does not.
  Status make_wait(const Stream& stream) const;
  Status synchronize() const;  // host waits until the event has been reached
  // Milliseconds of GPU time from `start` to `end`, both recorded and reached.
  static Expected<float> elapsed_ms(const Event& start, const Event& end);

 private:
  explicit Event(void* handle) : handle_(handle) {}
  void* handle_ = nullptr;
};

// Pinned (page-locked) host memory: the GPU's copy engines read and write it directly, so an
// async copy from it returns at once and overlaps kernels; an async copy from pageable memory is
// staged by the driver and blocks the host. nbytes = 0 gives a valid, unique, non-null pointer.
Expected<void*> malloc_pinned(int64_t nbytes);
void free_pinned(void* ptr);  // null is a no-op

// Copies queued on `stream`: they return at once (from pinned host memory) and complete in the
// stream's order; the host may touch the bytes only after the stream (or an event after the
// copy) has been synchronized.
Status copy_host_to_device_async(void* dst_device, const void* src_host, int64_t nbytes,
                                 const Stream& stream);
Status copy_device_to_host_async(void* dst_host, const void* src_device, int64_t nbytes,
                                 const Stream& stream);

// A CUDA graph: the launches and copies that `record` queues on `stream` (through StreamScope,
// which capture() opens) are captured, not run, then instantiated once; launch() replays them all
// with one call, so their per-launch host cost is paid once at capture. Pointers and sizes are
// frozen in the graph: a replay reads new inputs only through the same buffers. `stream` must
// not be the default stream (CUDA cannot capture it).
class Graph {
 public:
  Graph() = default;
  static Expected<Graph> capture(const Stream& stream, const std::function<Status()>& record);
  ~Graph();
  Graph(Graph&& other) noexcept { *this = std::move(other); }
  Graph& operator=(Graph&& other) noexcept {
    std::swap(graph_, other.graph_);
    std::swap(exec_, other.exec_);
    std::swap(nodes_, other.nodes_);
    return *this;
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  bool defined() const { return exec_ != nullptr; }
  int64_t nodes() const { return nodes_; }  // kernels, copies and memsets captured
  Status launch(const Stream& stream) const;

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  int64_t nodes_ = 0;
};

// Pinned host bytes owned for the buffer's life (malloc_pinned / free_pinned).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Expected<PinnedBuffer> allocate(int64_t nbytes);
  ~PinnedBuffer() { free_pinned(data_); }
  PinnedBuffer(PinnedBuffer&& other) noexcept : data_(other.data_), nbytes_(other.nbytes_) {
    other.data_ = nullptr;
    other.nbytes_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(nbytes_, other.nbytes_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }

 private:
  void* data_ = nullptr;
  int64_t nbytes_ = 0;
};

}  // namespace cuda_runtime

// Shorthand for the check every CUDA caller and test makes first.
inline bool cuda_available() { return cuda_runtime::available(); }

}  // namespace kiln
