// A fresh, empty directory under the system's temporary directory, for tests that write files.
#pragma once

#include <filesystem>

namespace kiln {

inline std::filesystem::path tmp_dir(const char* name) {
  std::filesystem::path p = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace kiln
