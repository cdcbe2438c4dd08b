// Parsing and validation of kiln's environment variables (see env.h). The library's readers
// (thread_pool.cpp, cpu_features.cpp) parse with the same functions, so what main validated is
// exactly what they use.
#include "kiln/core/env.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "kiln/core/cpu_features.h"
#include "kiln/core/thread_pool.h"

namespace kiln {

std::optional<std::string_view> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string_view(v);
}

Expected<std::optional<long long>> env_int(const char* name, long long lo, long long hi) {
  const auto v = env_value(name);
  if (!v) return std::optional<long long>{};
  const std::string s(*v);
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || errno == ERANGE || n < lo || n > hi)
    return invalid_argument("{}='{}': expected an integer in [{}, {}]", name, s, lo, hi);
  return std::optional<long long>{n};
}

Expected<std::optional<std::string_view>> env_choice(const char* name, std::span<const std::string_view> choices) {
  const auto v = env_value(name);
  if (!v) return std::optional<std::string_view>{};
  std::string list;
  for (std::string_view c : choices) {
    if (*v == c) return std::optional<std::string_view>{c};
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  return invalid_argument("{}='{}': expected one of {}", name, *v, list);
}

namespace {

// A file variable may name a file that does not exist yet (it is created on save), not a directory.
Status check_file_var(const char* name) {
  const auto v = env_value(name);
  if (!v) return {};
  std::error_code ec;
  if (std::filesystem::is_directory(std::filesystem::path(*v), ec))
    return invalid_argument("{}='{}' is a directory; expected a file path", name, *v);
  return {};
}

}  // namespace

Status validate_environment() {
  if (auto n = env_int("KILN_NUM_THREADS", 1, kMaxThreads); !n.ok()) return n.status();
  if (auto n = env_int("KILN_COMM_TIMEOUT", 1, kMaxCommTimeoutSeconds); !n.ok()) return n.status();
  if (auto s = simd_target_from_env(); !s.ok()) return s.status();
  if (auto p = pin_mode_from_env(); !p.ok()) return p.status();
  if (auto c = env_choice("KILN_AUTOTUNE", kAutotuneChoices); !c.ok()) return c.status();
  if (auto c = env_choice("KILN_BF16_GEMM", kBf16GemmChoices); !c.ok()) return c.status();
  if (auto c = env_choice("KILN_FLASH_TILES", kFlashTilesChoices); !c.ok()) return c.status();
  for (const char* name : {"KILN_TUNE_FILE", "KILN_COMM_CALIBRATION"})
    if (Status st = check_file_var(name); !st.ok()) return st;
  return {};
}

}  // namespace kiln
