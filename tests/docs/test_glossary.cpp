// docs/glossary.md must tell the truth: all 164 glossary terms have a row, every file a row
// names exists, every `file::Name` test names text in that file, and every `kiln ...`
// benchmark command is a real CLI command.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path kSource = KILN_SOURCE_DIR;
const fs::path kBinary = KILN_BINARY_DIR;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Row {
  std::string term;
  std::vector<std::string> cells;  // code, test, benchmark
};

std::vector<std::string> split_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cur;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '|' && line[i - 1] != '\\') {
      cells.push_back(cur);
      cur.clear();
    } else {
      cur += line[i];
    }
  }
  for (auto& c : cells) {
    c.erase(0, c.find_first_not_of(' '));
    c.erase(c.find_last_not_of(' ') + 1);
  }
  return cells;
}

std::vector<Row> parse_rows() {
  std::vector<Row> rows;
  std::istringstream in(read_file(kSource / "docs/glossary.md"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| ", 0) != 0 || line.rfind("| term |", 0) == 0) continue;
    auto cells = split_cells(line);
    if (cells.size() < 4) continue;
    rows.push_back({cells[0], {cells[1], cells[2], cells[3]}});
  }
  return rows;
}

std::vector<std::string> backticked(const std::string& cell) {
  std::vector<std::string> out;
  static const std::regex re("`([^`]+)`");
  for (auto it = std::sregex_iterator(cell.begin(), cell.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

TEST(Glossary, EveryTermHasARow) {
  const auto rows = parse_rows();
  EXPECT_EQ(rows.size(), 164u);
  std::set<std::string> terms;
  for (const auto& r : rows) terms.insert(r.term);
  EXPECT_EQ(terms.size(), rows.size()) << "duplicate rows";
  // When the spec is beside the checkout (as in CI), every term in it must be in the table.
  const fs::path spec = kSource.parent_path() / "shared/spec/glossary.txt";
  if (!fs::exists(spec)) GTEST_SKIP() << spec << " not present";
  std::istringstream in(read_file(spec));
  std::string line, prev;
  int found = 0;
  while (std::getline(in, line)) {
    line.erase(0, line.find_first_not_of(' '));
    if (line.find("Introduced in: Lesson") != std::string::npos) {
      ++found;
      EXPECT_TRUE(terms.count(prev)) << "glossary term missing from docs/glossary.md: " << prev;
    } else if (!line.empty()) {
      prev = line;
    }
  }
  EXPECT_EQ(found, 164);
}

TEST(Glossary, NamedFilesAndTestsExist) {
  for (const auto& r : parse_rows()) {
    for (int c = 0; c < 2; ++c) {
      for (const std::string& ref : backticked(r.cells[c])) {
        const auto sep = ref.find("::");
        const std::string path = ref.substr(0, sep);
        ASSERT_TRUE(fs::exists(kSource / path)) << r.term << ": " << path << " does not exist";
        if (sep != std::string::npos) {
          const std::string name = ref.substr(sep + 2);
          EXPECT_NE(read_file(kSource / path).find(name), std::string::npos)
              << r.term << ": " << name << " not found in " << path;
        }
      }
    }
  }
}

TEST(Glossary, BenchmarkCommandsExist) {
  for (const auto& r : parse_rows()) {
    for (const std::string& cmd : backticked(r.cells[2])) {
      const auto at = cmd.find("kiln ");
      if (cmd.rfind("bench/", 0) == 0 || cmd.rfind("scripts/", 0) == 0) {
        EXPECT_TRUE(fs::exists(kSource / cmd.substr(0, cmd.find(' ')))) << r.term << ": " << cmd;
        continue;
      }
      ASSERT_NE(at, std::string::npos) << r.term << ": benchmark cell is neither a kiln command nor a bench/ path: " << cmd;
      // Keep the subcommand words (stop at the first flag) and ask for their help.
      std::istringstream words(cmd.substr(at + 5));
      std::string w, sub;
      while (words >> w && w[0] != '-') sub += " " + w;
      const std::string shell = (kBinary / "kiln").string() + sub + " --help > /dev/null 2>&1";
      EXPECT_EQ(std::system(shell.c_str()), 0) << r.term << ": `kiln" << sub << "` is not a command";
    }
  }
}

}  // namespace
