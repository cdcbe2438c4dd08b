// Tensor views, copies and conversions.
#include "kiln/core/tensor.h"

#include <algorithm>
#include <cstring>

#include "kiln/core/allocator.h"

namespace kiln {

// ---- Shape -------------------------------------------------------------------------------
Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  KILN_CHECK_MSG(dims.size() <= kMaxDims, "a Shape holds at most {} dims, got {}", kMaxDims,
                 dims.size());
  rank_ = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), dims_.begin());
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  return rank_ == o.rank_ && std::equal(begin(), end(), o.begin());
}

std::string Shape::to_string() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + (rank_ == 1 ? ",)" : ")");
}

Shape contiguous_strides(const Shape& shape) {
  Shape s = shape;
  int64_t stride = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    s[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return s;
}

// ---- Storage -----------------------------------------------------------------------------
std::shared_ptr<Storage> Storage::allocate(int64_t nbytes) {
  void* p = default_allocator().allocate(static_cast<size_t>(std::max<int64_t>(nbytes, 1)));
  return std::shared_ptr<Storage>(new Storage(p, nbytes, true));  // private ctor
}

Expected<std::shared_ptr<Storage>> Storage::allocate(int64_t nbytes, Device device) {
  if (device == Device::kHost) return allocate(nbytes);
  KILN_ASSIGN_OR_RETURN(void* p, cuda_runtime::malloc_device(nbytes));
  return std::shared_ptr<Storage>(new Storage(p, nbytes, true, device));
}

std::shared_ptr<Storage> Storage::borrow(void* data, int64_t nbytes) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, false));
}

Storage::~Storage() {
  if (!owned_) return;
  if (device_ == Device::kHost) {
    default_allocator().deallocate(data_);
  } else {
    cuda_runtime::free_device(data_);
  }
}

// ---- element conversion ------------------------------------------------------------------
float load_as_f32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF8E4M3: return f8e4m3_to_f32(static_cast<const uint8_t*>(base)[i]);
    case DType::kF8E5M2: return f8e5m2_to_f32(static_cast<const uint8_t*>(base)[i]);
    case DType::kI8: return static_cast<const int8_t*>(base)[i];
    case DType::kI32: return static_cast<float>(static_cast<const int32_t*>(base)[i]);
    default: fatal(__FILE__, __LINE__, fmt::format("load_as_f32: no path for {}", dtype_name(dtype)));
  }
}

void store_from_f32(void* base, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[i] = v; return;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); return;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); return;
    // fp8 stores round to nearest even without saturation (E4M3 overflow -> NaN, E5M2 -> inf);
    // scaled fp8 (amax, saturation) belongs to the callers that own the scale.
    case DType::kF8E4M3: static_cast<uint8_t*>(base)[i] = f32_to_f8e4m3(v); return;
    case DType::kF8E5M2: static_cast<uint8_t*>(base)[i] = f32_to_f8e5m2(v); return;
    default: fatal(__FILE__, __LINE__, fmt::format("store_from_f32: no path for {}", dtype_name(dtype)));
  }
}

namespace {
bool convertible(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF8E4M3 ||
         t == DType::kF8E5M2;
}

// Calls fn(logical_index, element_offset) over every element in row-major logical order.
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t base, F&& fn) {
  const int64_t n = shape.numel();
  if (n == 0) return;
  std::array<int64_t, kMaxDims> idx{};
  int64_t off = base;
  for (int64_t linear = 0; linear < n; ++linear) {
    fn(linear, off);
    for (int d = shape.rank() - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}
}  // namespace

// ---- Tensor ------------------------------------------------------------------------------
Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) KILN_CHECK_MSG(d >= 0, "negative dim in shape {}", shape.to_string());
  auto storage = Storage::allocate(dtype_nbytes(dtype, shape.numel()));
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Expected<Tensor> Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    if (d < 0) return invalid_argument("[empty] negative dim in shape {}", shape.to_string());
  KILN_ASSIGN_OR_RETURN(auto storage,
                        Storage::allocate(dtype_nbytes(dtype, shape.numel()), device));
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, static_cast<size_t>(t.nbytes()));
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Expected<Tensor> Tensor::from_floats(const Shape& shape, std::span<const float> values, DType dtype) {
  if (static_cast<int64_t>(values.size()) != shape.numel())
    return invalid_argument("[from_floats] shape {} needs {} values, got {}", shape.to_string(),
                            shape.numel(), values.size());
  if (!convertible(dtype))
    return invalid_argument("[from_floats] cannot convert f32 to {}", dtype_name(dtype));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i)
    store_from_f32(t.raw_data(), dtype, static_cast<int64_t>(i), values[i]);
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype) {
  return Tensor(Storage::borrow(data, dtype_nbytes(dtype, shape.numel())), shape,
                contiguous_strides(shape), 0, dtype);
}

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + dtype_nbytes(dtype_, offset_);
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Expected<int> Tensor::normalize_dim(const char* op, int dim) const {
  const int d = dim < 0 ? dim + rank() : dim;
  if (d < 0 || d >= rank())
    return out_of_range("[{}] dim {} is out of range for a tensor of shape {}", op, dim,
                        shape_.to_string());
  return d;
}

Expected<Tensor> Tensor::slice(int dim, int64_t start, int64_t end) const {
  KILN_ASSIGN_OR_RETURN(int d, normalize_dim("slice", dim));
  if (start < 0 || end < start || end > shape_[d])
    return out_of_range("[slice] range [{}, {}) is outside dim {} of size {} (shape {})", start,
                        end, d, shape_[d], shape_.to_string());
  if (dtype_ == DType::kI4) return unimplemented("[slice] views of packed int4 tensors");
  Tensor t = *this;
  t.shape_[d] = end - start;
  t.offset_ += start * strides_[d];
  return t;
}

Expected<Tensor> Tensor::select(int dim, int64_t index) const {
  KILN_ASSIGN_OR_RETURN(int d, normalize_dim("select", dim));
  if (index < 0 || index >= shape_[d])
    return out_of_range("[select] index {} is outside dim {} of size {} (shape {})", index, d,
                        shape_[d], shape_.to_string());
  std::array<int64_t, kMaxDims> dims{}, strides{};
  int r = 0;
  for (int i = 0; i < rank(); ++i) {
    if (i == d) continue;
    dims[r] = shape_[i];
    strides[r++] = strides_[i];
  }
  Tensor t = *this;
  t.shape_ = Shape(std::span<const int64_t>(dims.data(), r));
  t.strides_ = Shape(std::span<const int64_t>(strides.data(), r));
  t.offset_ += index * strides_[d];
  return t;
}

Expected<Tensor> Tensor::transpose(int dim0, int dim1) const {
  KILN_ASSIGN_OR_RETURN(int a, normalize_dim("transpose", dim0));
  KILN_ASSIGN_OR_RETURN(int b, normalize_dim("transpose", dim1));
  if (dtype_ == DType::kI4) return unimplemented("[transpose] views of packed int4 tensors");
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

namespace {
// Resolves one -1 in `shape` against numel.
Expected<Shape> infer_shape(const char* op, const Shape& from, Shape shape) {
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) return invalid_argument("[{}] only one dim may be -1, got {}", op, shape.to_string());
      infer = i;
    } else if (shape[i] < 0) {
      return invalid_argument("[{}] negative dim in {}", op, shape.to_string());
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || from.numel() % known != 0)
      return invalid_argument("[{}] cannot view shape {} as {}", op, from.to_string(), shape.to_string());
    shape[infer] = from.numel() / known;
  }
  if (shape.numel() != from.numel())
    return invalid_argument("[{}] cannot view shape {} ({} elements) as {} ({} elements)", op,
                            from.to_string(), from.numel(), shape.to_string(), shape.numel());
  return shape;
}
}  // namespace

Expected<Tensor> Tensor::view(const Shape& new_shape) const {
  KILN_ASSIGN_OR_RETURN(Shape shape, infer_shape("view", shape_, new_shape));
  Tensor t = *this;
  t.shape_ = shape;
  if (is_contiguous() || shape.numel() == 0) {
    t.strides_ = contiguous_strides(shape);
    return t;
  }
  // Non-contiguous: legal when each group of new dims covers a run of old dims that is itself
  // contiguous (stride[i] == stride[i+1] * size[i+1] inside the run). Walk both from the back.
  const auto not_viewable = [&] {
    return invalid_argument("[view] shape {} with strides {} cannot be viewed as {}; use reshape (copies)",
                            shape_.to_string(), strides_.to_string(), shape.to_string());
  };
  Shape strides = contiguous_strides(shape);
  int oi = rank() - 1, ni = shape.rank() - 1;
  for (;;) {
    while (oi >= 0 && shape_[oi] == 1) --oi;
    while (ni >= 0 && shape[ni] == 1) --ni;
    if (oi < 0 || ni < 0) break;
    int64_t old_chunk = shape_[oi], new_chunk = shape[ni];
    int64_t prev_old = oi;  // innermost old dim of the current run
    strides[ni] = strides_[oi];
    while (old_chunk != new_chunk) {
      if (old_chunk < new_chunk) {
        --oi;
        while (oi >= 0 && shape_[oi] == 1) --oi;
        if (oi < 0 || strides_[oi] != strides_[prev_old] * shape_[prev_old]) return not_viewable();
        prev_old = oi;
        old_chunk *= shape_[oi];
      } else {
        --ni;
        if (ni < 0) return not_viewable();
        strides[ni] = strides[ni + 1] * shape[ni + 1];
        new_chunk *= shape[ni];
      }
    }
    --oi;
    --ni;
  }
  t.strides_ = strides;
  return t;
}

Expected<Tensor> Tensor::reshape(const Shape& new_shape) const {
  KILN_ASSIGN_OR_RETURN(Shape shape, infer_shape("reshape", shape_, new_shape));
  auto v = view(shape);
  if (v.ok()) return v;
  return contiguous().view(shape);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_);
  out.copy_from(*this).check_ok(__FILE__, __LINE__);
  return out;
}

Status Tensor::copy_from(const Tensor& src) {
  if (device() != Device::kHost || src.device() != Device::kHost)
    return failed_precondition("[copy_from] {} tensor into {} tensor: copy_from is host only; use to(Device)",
                               device_name(src.device()), device_name(device()));
  if (!(src.shape_ == shape_))
    return invalid_argument("[copy_from] shape {} into shape {}", src.shape_.to_string(), shape_.to_string());
  if (dtype_ == src.dtype_ && is_contiguous() && src.is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), static_cast<size_t>(nbytes()));
    return {};
  }
  if (!convertible(dtype_) || !convertible(src.dtype_)) {
    if (dtype_ != src.dtype_)
      return unimplemented("[copy_from] conversion {} -> {}", dtype_name(src.dtype_), dtype_name(dtype_));
  }
  // General strided path: gather source offsets, then scatter to destination offsets.
  std::vector<int64_t> src_off(static_cast<size_t>(numel()));
  for_each_offset(src.shape_, src.strides_, src.offset_, [&](int64_t i, int64_t off) { src_off[i] = off; });
  void* sbase = src.storage_->data();
  void* dbase = storage_->data();
  const int64_t esize = dtype_bits(dtype_) / 8;
  for_each_offset(shape_, strides_, offset_, [&](int64_t i, int64_t off) {
    if (dtype_ == src.dtype_) {
      std::memcpy(static_cast<char*>(dbase) + off * esize, static_cast<char*>(sbase) + src_off[i] * esize,
                  static_cast<size_t>(esize));
    } else {
      store_from_f32(dbase, dtype_, off, load_as_f32(sbase, src.dtype_, src_off[i]));
    }
  });
  return {};
}

Expected<Tensor> Tensor::to(DType dtype) const {
  if (!convertible(dtype) || !convertible(dtype_))
    return unimplemented("[to] conversion {} -> {}", dtype_name(dtype_), dtype_name(dtype));
  Tensor out = empty(shape_, dtype);
  KILN_RETURN_IF_ERROR(out.copy_from(*this));
  return out;
}

int64_t Tensor::element_offset(std::initializer_list<int64_t> index) const {
  check_host("element access");
  KILN_CHECK_MSG(static_cast<int>(index.size()) == rank(), "index of rank {} into shape {}",
                 index.size(), shape_.to_string());
  int64_t off = offset_;
  int d = 0;
  for (int64_t i : index) {
    KILN_CHECK_MSG(i >= 0 && i < shape_[d], "index {} out of range for dim {} of shape {}", i, d,
                   shape_.to_string());
    off += i * strides_[d++];
  }
  return off;
}

float Tensor::get(std::initializer_list<int64_t> index) const {
  return load_as_f32(storage_->data(), dtype_, element_offset(index));
}

void Tensor::set(std::initializer_list<int64_t> index, float value) {
  store_from_f32(storage_->data(), dtype_, element_offset(index), value);
}

std::vector<float> Tensor::to_floats() const {
  check_host("to_floats");
  std::vector<float> out(static_cast<size_t>(numel()));
  for_each_offset(shape_, strides_, offset_,
                  [&](int64_t i, int64_t off) { out[i] = load_as_f32(storage_->data(), dtype_, off); });
  return out;
}

void Tensor::fill(float value) {
  check_host("fill");
  for_each_offset(shape_, strides_, offset_,
                  [&](int64_t, int64_t off) { store_from_f32(storage_->data(), dtype_, off, value); });
}

std::string Tensor::to_string() const {
  if (!defined()) return "Tensor(undefined)";
  return fmt::format("Tensor({}, {}, strides {}{})", dtype_name(dtype_), shape_.to_string(),
                     strides_.to_string(), device() == Device::kHost ? "" : ", cuda");
}

void Tensor::check_host(const char* what) const {
  KILN_CHECK_MSG(device() == Device::kHost, "{} on a {} tensor (copy it with to(Device::kHost))",
                 what, device_name(device()));
}

Expected<Tensor> Tensor::to(Device device) const {
  if (!defined()) return invalid_argument("[to] {} of an undefined tensor", device_name(device));
  const Device from = this->device();
  if (from == device) return *this;
  if (from == Device::kCuda && !is_contiguous())
    return invalid_argument("[to] non-contiguous cuda tensor {} to {}", to_string(), device_name(device));
  const Tensor src = contiguous();  // host side: a packed copy when strided
  KILN_ASSIGN_OR_RETURN(auto storage, Storage::allocate(nbytes(), device));
  const void* src_bytes = src.raw_data();
  void* dst_bytes = storage->data();
  KILN_RETURN_IF_ERROR(device == Device::kCuda
                           ? cuda_runtime::copy_host_to_device(dst_bytes, src_bytes, nbytes())
                           : cuda_runtime::copy_device_to_host(dst_bytes, src_bytes, nbytes()));
  return Tensor(std::move(storage), shape_, contiguous_strides(shape_), 0, dtype_);
}

}  // namespace kiln
