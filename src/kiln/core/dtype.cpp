// Parsing dtype names; the conversions themselves are inline in dtype.h.
#include "kiln/core/dtype.h"

namespace kiln {

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& t : kDTypeTraits)
    if (t.name == name) return t.dtype;
  if (name == "fp32" || name == "float32") return DType::kF32;
  if (name == "fp16" || name == "float16") return DType::kF16;
  if (name == "bfloat16") return DType::kBF16;
  return std::nullopt;
}

}  // namespace kiln
