// kiln's environment variables (KILN_NUM_THREADS, KILN_COMM_TIMEOUT, KILN_SIMD, KILN_PIN_THREADS, KILN_TUNE_FILE,
// KILN_COMM_CALIBRATION), validated like flags: `kiln` calls validate_environment() before any
// work, so a bad value is one clear error naming the variable, not a silent default.
#pragma once

#include <optional>
#include <string_view>

#include "kiln/core/status.h"

namespace kiln {

// A variable's value: nullopt when unset or empty (both mean "the default").
std::optional<std::string_view> env_value(const char* name);

// The whole value as a decimal integer in [lo, hi]; nullopt when unset. InvalidArgument names the
// variable and the value ("KILN_NUM_THREADS='abc': expected an integer in [1, 1024]").
Expected<std::optional<long long>> env_int(const char* name, long long lo, long long hi);

// KILN_NUM_THREADS: worker threads, the same range as `--threads`.
inline constexpr long long kMaxThreads = 1024;
// KILN_COMM_TIMEOUT: seconds a communication thread waits for another rank before it ends the job.
inline constexpr long long kMaxCommTimeoutSeconds = 86400;

// Every KILN_* variable kiln reads: its value parses and is in range (KILN_SIMD names a target
// this CPU supports; KILN_PIN_THREADS is auto|on|off|1|0; the file variables do not name a
// directory). The first problem found, or ok.
Status validate_environment();

}  // namespace kiln
