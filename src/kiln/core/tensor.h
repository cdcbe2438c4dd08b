// Tensor: a shape, strides (in elements), a dtype and shared storage with an offset.
// Views (slice, select, transpose, view/reshape) share storage; contiguous() and to() copy.
// Shape and dtype mistakes at this boundary come back as a Status naming the op and shapes.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/status.h"

namespace kiln {

inline constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const;
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  bool operator==(const Shape& o) const;
  std::string to_string() const;  // "(2, 3, 4)"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

// Bytes owned by the caching allocator, or borrowed memory (e.g. an mmap'ed file) not owned,
// or bytes on a CUDA device (owned, freed through core/device.h). Storage knows its device;
// host code must not dereference a device storage's data().
class Storage {
 public:
  static std::shared_ptr<Storage> allocate(int64_t nbytes);  // host
  // On `device`: FailedPrecondition/Unavailable when this build or machine has no CUDA device,
  // ResourceExhausted when device memory is short.
  static Expected<std::shared_ptr<Storage>> allocate(int64_t nbytes, Device device);
  static std::shared_ptr<Storage> borrow(void* data, int64_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  int64_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, int64_t nbytes, bool owned, Device device = Device::kHost)
      : data_(data), nbytes_(nbytes), owned_(owned), device_(device) {}
  void* data_;
  int64_t nbytes_;
  bool owned_;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined

  static Tensor empty(const Shape& shape, DType dtype = DType::kF32);
  // Uninitialized, contiguous, on `device`: the named errors of Storage::allocate on a device.
  static Expected<Tensor> empty(const Shape& shape, DType dtype, Device device);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32);
  static Tensor full(const Shape& shape, float value, DType dtype = DType::kF32);
  // Copies `values` (numel of them), converting from f32 to `dtype`.
  static Expected<Tensor> from_floats(const Shape& shape, std::span<const float> values,
                                      DType dtype = DType::kF32);
  // A tensor over memory the caller keeps alive.
  static Tensor borrow(void* data, const Shape& shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_.numel(); }
  int64_t nbytes() const { return dtype_nbytes(dtype_, numel()); }
  int64_t offset() const { return offset_; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  Device device() const { return storage_ ? storage_->device() : Device::kHost; }

  // Typed access; aborts if T does not match the dtype (a program error, not user input).
  template <class T>
  T* data() const {
    KILN_CHECK_MSG(DTypeOf<T>::value == dtype_, "data<{}>() on a {} tensor",
                   dtype_name(DTypeOf<T>::value), dtype_name(dtype_));
    return reinterpret_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // ---- views (share storage) ----
  Expected<Tensor> slice(int dim, int64_t start, int64_t end) const;  // [start, end)
  Expected<Tensor> select(int dim, int64_t index) const;              // drops `dim`
  Expected<Tensor> transpose(int dim0, int dim1) const;
  // A view with a new shape (one dim may be -1); fails when the strides do not allow it.
  Expected<Tensor> view(const Shape& shape) const;
  // view() when legal, else a contiguous copy with the new shape.
  Expected<Tensor> reshape(const Shape& shape) const;

  // ---- copies ----
  Tensor contiguous() const;  // itself when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Expected<Tensor> to(DType dtype) const;  // converting contiguous copy (float dtypes)
  Status copy_from(const Tensor& src);     // same shape; converts between float dtypes
  // A contiguous copy on `device` (itself when already there): the one explicit way bytes move
  // between host and device. Non-contiguous device tensors are not copied (InvalidArgument);
  // without CUDA (build or device) the error names what is missing.
  Expected<Tensor> to(Device device) const;

  // ---- element helpers (slow; tests and small tools; host tensors only) ----
  float get(std::initializer_list<int64_t> index) const;
  void set(std::initializer_list<int64_t> index, float value);
  std::vector<float> to_floats() const;  // logical order
  void fill(float value);

  std::string to_string() const;  // "Tensor(f32, (2, 3), strides (3, 1))"

 private:
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dt)
      : storage_(std::move(storage)), shape_(shape), strides_(strides), offset_(offset),
        dtype_(dt) {}
  Expected<int> normalize_dim(const char* op, int dim) const;
  int64_t element_offset(std::initializer_list<int64_t> index) const;
  void check_host(const char* what) const;  // aborts on a device tensor

  std::shared_ptr<Storage> storage_;
  Shape shape_, strides_;
  int64_t offset_ = 0;  // elements
  DType dtype_ = DType::kF32;
};

Shape contiguous_strides(const Shape& shape);

// Element conversion between float dtypes (f32, bf16, f16), one value.
float load_as_f32(const void* base, DType dtype, int64_t index);
void store_from_f32(void* base, DType dtype, int64_t index, float value);

}  // namespace kiln
