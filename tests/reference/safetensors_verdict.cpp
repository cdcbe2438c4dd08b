// For tests/reference/safetensors_check.py: opens each file named on the command line with
// kiln's safetensors reader and prints "ACCEPT" or "REJECT <why>" per line, in order.
#include <cstdio>

#include "kiln/model/safetensors.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    auto f = kiln::SafetensorsFile::open(argv[i]);
    if (f.ok()) std::printf("ACCEPT\n");
    else std::printf("REJECT %s\n", f.status().message().c_str());
  }
  return 0;
}
