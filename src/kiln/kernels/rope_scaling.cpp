// RoPE frequency scalings (rope.h): linear, llama3 and yarn, after the formulas of transformers'
// modeling_rope_utils.py, computed in double (HF computes them in fp32; the two agree to a few
// ulp of each frequency). make_rope_table turns the frequencies into the cos/sin table.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "kiln/kernels/rope.h"

namespace kiln {
namespace {

bool positive_finite(double x) { return std::isfinite(x) && x > 0.0; }

// The pair index (a fractional dimension) whose frequency turns num_rotations times over
// max_positions: D · ln(max_positions / (num_rotations · 2π)) / (2 ln theta).
double yarn_correction_dim(double num_rotations, int64_t head_dim, double theta, int64_t max_positions) {
  return static_cast<double>(head_dim) *
         std::log(static_cast<double>(max_positions) / (num_rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta));
}

// yarn's attention factor for a context scale s and a multiplier m: 1 + 0.1·m·ln s (1 for s <= 1).
double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

}  // namespace

std::string_view rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::kDefault: return "default";
    case RopeType::kLinear: return "linear";
    case RopeType::kLlama3: return "llama3";
    case RopeType::kYarn: return "yarn";
  }
  return "?";
}

Status check_rope_scaling(const RopeScaling& s) {
  const std::string_view name = rope_type_name(s.type);
  if (s.type == RopeType::kDefault) return {};
  if (!positive_finite(s.factor)) return invalid_argument("[rope] {} factor must be finite and > 0, got {}", name, s.factor);
  if (s.type == RopeType::kLinear) return {};
  if (s.original_max_positions <= 0)
    return invalid_argument("[rope] {} original_max_position_embeddings must be positive, got {}", name,
                            s.original_max_positions);
  if (s.type == RopeType::kLlama3) {
    if (!positive_finite(s.low_freq_factor) || !positive_finite(s.high_freq_factor))
      return invalid_argument("[rope] llama3 low_freq_factor {} and high_freq_factor {} must be finite and > 0",
                              s.low_freq_factor, s.high_freq_factor);
    if (!(s.high_freq_factor > s.low_freq_factor))  // the blend divides by their difference
      return invalid_argument("[rope] llama3 high_freq_factor {} must be greater than low_freq_factor {}",
                              s.high_freq_factor, s.low_freq_factor);
    return {};
  }
  if (!positive_finite(s.beta_fast) || !positive_finite(s.beta_slow))
    return invalid_argument("[rope] yarn beta_fast {} and beta_slow {} must be finite and > 0", s.beta_fast, s.beta_slow);
  if (!std::isfinite(s.mscale) || !std::isfinite(s.mscale_all_dim) || s.mscale < 0 || s.mscale_all_dim < 0)
    return invalid_argument("[rope] yarn mscale {} and mscale_all_dim {} must be finite and >= 0", s.mscale,
                            s.mscale_all_dim);
  if (!std::isfinite(s.attention_factor) || s.attention_factor < 0)
    return invalid_argument("[rope] yarn attention_factor must be finite and >= 0 (0: derived), got {}",
                            s.attention_factor);
  if (!positive_finite(rope_attention_factor(s)))
    return invalid_argument("[rope] yarn factor {} with mscale {} / mscale_all_dim {} gives attention factor {}",
                            s.factor, s.mscale, s.mscale_all_dim, rope_attention_factor(s));
  return {};
}

double rope_attention_factor(const RopeScaling& s) {
  if (s.type != RopeType::kYarn) return 1.0;
  if (s.attention_factor > 0) return s.attention_factor;
  if (s.mscale > 0 && s.mscale_all_dim > 0)  // DeepSeek-style: the ratio of the two
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

std::vector<double> rope_frequencies(int64_t head_dim, double theta, const RopeScaling& s) {
  const int64_t half = head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  switch (s.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
      for (double& x : f) x /= s.factor;
      break;
    case RopeType::kLlama3: {
      const double old_len = static_cast<double>(s.original_max_positions);
      const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
      for (double& x : f) {
        const double wavelen = 2.0 * std::numbers::pi / x;
        if (wavelen > low_wavelen) {
          x /= s.factor;  // low frequencies: interpolated
        } else if (!(wavelen < high_wavelen)) {  // between: blended
          const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          x = (1.0 - smooth) * x / s.factor + smooth * x;
        }  // high frequencies: kept
      }
      break;
    }
    case RopeType::kYarn: {
      double low = yarn_correction_dim(s.beta_fast, head_dim, theta, s.original_max_positions);
      double high = yarn_correction_dim(s.beta_slow, head_dim, theta, s.original_max_positions);
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(head_dim - 1));
      if (low == high) high += 0.001;  // as HF: no division by zero
      for (int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        double& x = f[static_cast<size_t>(i)];
        x = (x / s.factor) * ramp + x * (1.0 - ramp);  // ramp 0: extrapolated (kept), 1: interpolated
      }
      break;
    }
  }
  return f;
}

}  // namespace kiln
