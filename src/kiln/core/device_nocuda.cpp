// The device runtime of a build without the CUDA backend: every device call is a named error
// (FailedPrecondition), so code that asks for a CUDA tensor learns why there is none.
#include "kiln/core/device.h"

namespace kiln::cuda_runtime {
namespace {
Status not_built(const char* what) {
  return failed_precondition("{}: kiln was built without CUDA (-DKILN_CUDA=OFF or no nvcc found)",
                             what);
}
}  // namespace

bool built_with_cuda() {
  return false;
}
int device_count() {
  return 0;
}
bool available() {
  return false;
}
std::string unavailable_reason() {
  return not_built("cuda").message();
}

Expected<void*> malloc_device(int64_t) {
  return not_built("malloc_device");
}
void free_device(void* ptr) {
  KILN_CHECK_MSG(ptr == nullptr, "free_device of a pointer in a build without CUDA");
}
Status copy_host_to_device(void*, const void*, int64_t) {
  return not_built("copy_host_to_device");
}
Status copy_device_to_host(void*, const void*, int64_t) {
  return not_built("copy_device_to_host");
}
Status copy_device_to_device(void*, const void*, int64_t) {
  return not_built("copy_device_to_device");
}
Status memset_device(void*, int, int64_t) {
  return not_built("memset_device");
}
Status synchronize() {
  return not_built("synchronize");
}

// Nothing below can hold a handle in this build: every constructor that makes one fails.
Expected<Stream> Stream::create() {
  return not_built("Stream::create");
}
Stream::~Stream() = default;
Status Stream::synchronize() const {
  return not_built("Stream::synchronize");
}

Expected<Event> Event::create() {
  return not_built("Event::create");
}
Event::~Event() = default;
Status Event::record(const Stream&) {
  return not_built("Event::record");
}
Status Event::make_wait(const Stream&) const {
  return not_built("Event::make_wait");
}
Status Event::synchronize() const {
  return not_built("Event::synchronize");
}
Expected<float> Event::elapsed_ms(const Event&, const Event&) {
  return not_built("Event::elapsed_ms");
}

Expected<void*> malloc_pinned(int64_t) {
  return not_built("malloc_pinned");
}
void free_pinned(void* ptr) {
  KILN_CHECK_MSG(ptr == nullptr, "free_pinned of a pointer in a build without CUDA");
}
Status copy_host_to_device_async(void*, const void*, int64_t, const Stream&) {
  return not_built("copy_host_to_device_async");
}
Status copy_device_to_host_async(void*, const void*, int64_t, const Stream&) {
  return not_built("copy_device_to_host_async");
}

Expected<Graph> Graph::capture(const Stream&, const std::function<Status()>&) {
  return not_built("Graph::capture");
}
Graph::~Graph() = default;
Status Graph::launch(const Stream&) const {
  return not_built("Graph::launch");
}

}  // namespace kiln::cuda_runtime
