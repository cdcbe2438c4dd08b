// Placeholder translation unit so the bench library always has one source.
#include "bench/bench_util.h"
