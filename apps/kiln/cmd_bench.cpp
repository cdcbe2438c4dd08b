// `kiln bench <what>`: kiln beside its peers in one run (the code lives in bench/).
#include "apps/kiln/commands.h"

namespace kiln::app {

void register_bench(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench", "Benchmarks: kiln beside its peers, ratios printed");
  cmd->require_subcommand(1);
}

}  // namespace kiln::app
