// kiln's environment variables (KILN_NUM_THREADS, KILN_COMM_TIMEOUT, KILN_SIMD, KILN_PIN_THREADS, KILN_TUNE_FILE,
// KILN_COMM_CALIBRATION, KILN_AUTOTUNE, KILN_BF16_GEMM, KILN_FLASH_TILES), validated like flags: `kiln` calls validate_environment() before any
// work, so a bad value is one clear error naming the variable, not a silent default.
#pragma once

#include <span>
#include <optional>
#include <string_view>

#include "kiln/core/status.h"

namespace kiln {

// A variable's value: nullopt when unset or empty (both mean "the default").
std::optional<std::string_view> env_value(const char* name);

// The whole value as a decimal integer in [lo, hi]; nullopt when unset. InvalidArgument names the
// variable and the value ("KILN_NUM_THREADS='abc': expected an integer in [1, 1024]").
Expected<std::optional<long long>> env_int(const char* name, long long lo, long long hi);

// The value when it is one of `choices`; nullopt when unset. InvalidArgument names the variable,
// the value and the choices ("KILN_BF16_GEMM='fast': expected one of auto, dot, widen, amx").
Expected<std::optional<std::string_view>> env_choice(const char* name, std::span<const std::string_view> choices);

// KILN_AUTOTUNE: 1 (default) lets `kiln` time the GEMM blocking once per CPU at first use; 0 never.
inline constexpr std::string_view kAutotuneChoices[] = {"0", "1"};
// KILN_BF16_GEMM: the bf16 GEMM's products, vdpbf16ps ("dot"), widened to f32 ("widen") or AMX
// tiles ("amx"); "auto" (default) picks the fastest this CPU has (kernels/cpu/gemm_cpu.h).
inline constexpr std::string_view kBf16GemmChoices[] = {"auto", "dot", "widen", "amx"};
// KILN_FLASH_TILES: the CPU FlashAttention's queries x keys per tile for forward and backward;
// "auto" (default): the tune file's, else the cache model's (kernels/cpu/attention_tiles.h,
// which checks at compile time that these are exactly its candidates).
inline constexpr std::string_view kFlashTilesChoices[] = {"auto",   "32x64",  "32x128",  "32x256",  "64x64",
                                                          "64x128", "64x256", "128x64", "128x128", "128x256"};

// KILN_NUM_THREADS: worker threads, the same range as `--threads`.
inline constexpr long long kMaxThreads = 1024;
// KILN_COMM_TIMEOUT: seconds a communication thread waits for another rank before it ends the job.
inline constexpr long long kMaxCommTimeoutSeconds = 86400;

// Every KILN_* variable kiln reads: its value parses and is in range (KILN_SIMD names a target
// this CPU supports; KILN_PIN_THREADS is auto|on|off|1|0; the file variables do not name a
// directory). The first problem found, or ok.
Status validate_environment();

}  // namespace kiln
