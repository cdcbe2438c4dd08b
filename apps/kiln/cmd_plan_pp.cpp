// `kiln plan pp`: a pipeline schedule on paper (parallel/pipeline_schedule.h): each rank's
// action list, the bubble of its ideal timeline (every stage the same F, B, W and communication
// costs) beside the textbook formula, and the peak activations per rank beside the bound; with
// --svg, the timeline drawn. No MPI: the same lists the executor runs, simulated.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/kiln/commands.h"
#include "kiln/core/file_io.h"
#include "kiln/parallel/pipeline_schedule.h"

namespace kiln::app {
namespace {

struct PlanPpOptions {
  int ranks = 0, micro_batches = 4, virtual_stages = 1;
  std::string schedule = "1f1b";
  double forward_ms = 1, backward_ms = 2, weight_ms = -1, comm_ms = 0;  // weight_ms < 0: half of backward_ms
  std::string svg;
  bool json = false;
};

// "F3", or "F3@5" (micro-batch 3 on stage 5) where a rank holds several stages.
std::string token(const pipeline::Action& a, bool with_stage) {
  return with_stage ? fmt::format("{}{}@{}", pipeline::action_name(a.kind), a.micro_batch, a.stage)
                    : fmt::format("{}{}", pipeline::action_name(a.kind), a.micro_batch);
}

int run_plan_pp(const PlanPpOptions& o, bool virtual_stages_given) {
  const auto kind = pipeline::parse_schedule(o.schedule);
  if (!kind.ok()) {
    fmt::print(stderr, "kiln plan pp: --schedule: {}\n", kind.status().message());
    return kUserError;
  }
  pipeline::ScheduleSpec spec{*kind, o.ranks, o.micro_batches, o.virtual_stages};
  if (*kind == pipeline::ScheduleKind::kInterleaved1F1B && !virtual_stages_given) spec.virtual_stages = 2;
  if (const Status st = pipeline::check_schedule_spec(spec); !st.ok()) {
    // V's rules first; what is left (divisibility, the tag bound) is the micro-batch count's.
    const bool v_wrong = *kind == pipeline::ScheduleKind::kInterleaved1F1B ? spec.virtual_stages < 2
                                                                           : spec.virtual_stages != 1;
    fmt::print(stderr, "kiln plan pp: {}: {}\n", v_wrong ? "--virtual-stages" : "--micro-batches", st.message());
    return kUserError;
  }
  const pipeline::Schedule schedule = pipeline::make_schedule(spec).value();
  pipeline::check_schedule(schedule).check_ok(__FILE__, __LINE__);  // a generator's list is always valid

  const bool split = *kind == pipeline::ScheduleKind::kZeroBubbleH1;
  const double weight_ms = o.weight_ms >= 0 ? o.weight_ms : o.backward_ms / 2;
  pipeline::ActionCosts costs;
  costs.forward = o.forward_ms * 1e-3;
  costs.backward_weight = (split ? weight_ms : o.backward_ms / 2) * 1e-3;
  costs.backward_input = o.backward_ms * 1e-3 - costs.backward_weight;
  costs.comm = o.comm_ms * 1e-3;
  if (costs.backward_input < 0) {
    fmt::print(stderr, "kiln plan pp: --weight-ms {} is more than --backward-ms {} (B + W)\n", weight_ms,
               o.backward_ms);
    return kUserError;
  }
  const auto timeline = pipeline::simulate_schedule(schedule, costs);
  const pipeline::ScheduleStats stats = pipeline::schedule_stats(schedule, timeline);
  const double formula = pipeline::bubble_formula(spec, costs);
  const std::vector<int> bound = pipeline::activation_bound(spec);

  const bool with_stage = spec.virtual_stages > 1;
  std::vector<std::vector<std::string>> lists;
  for (const auto& list : schedule.ranks) {
    std::vector<std::string>& tokens = lists.emplace_back();
    for (const pipeline::Action& a : list) tokens.push_back(token(a, with_stage));
  }
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"schedule", pipeline::schedule_name(spec.kind)},
                                      {"ranks", spec.ranks},
                                      {"micro_batches", spec.micro_batches},
                                      {"virtual_stages", spec.virtual_stages},
                                      {"forward_ms", o.forward_ms},
                                      {"backward_input_ms", costs.backward_input * 1e3},
                                      {"backward_weight_ms", costs.backward_weight * 1e3},
                                      {"comm_ms", o.comm_ms},
                                      {"actions", lists},
                                      {"makespan_ms", stats.makespan * 1e3},
                                      {"bubble_simulated", stats.bubble_fraction},
                                      {"bubble_formula", formula},
                                      {"peak_activations", stats.peak_activations},
                                      {"activation_bound", bound}}
                           .dump());
  } else {
    fmt::print("# plan pp: {}, P = {} ranks, M = {} micro-batches, V = {} virtual stages per rank ({} stages)\n",
               pipeline::schedule_name(spec.kind), spec.ranks, spec.micro_batches, spec.virtual_stages,
               spec.stages());
    fmt::print("# costs per stage: F {} ms, B {} ms{}, communication {} ms (ideal: every stage alike)\n",
               o.forward_ms, o.backward_ms,
               split ? fmt::format(" (BI {:g} + W {:g})", costs.backward_input * 1e3, costs.backward_weight * 1e3)
                     : std::string(),
               o.comm_ms);
    fmt::print("# actions: F forward, B backward, BI input gradient, W weight gradient, SA/RA send/receive "
               "activation, SG/RG send/receive gradient; then the micro-batch{}\n",
               with_stage ? ", @stage" : "");
    for (size_t r = 0; r < lists.size(); ++r) fmt::print("rank {}: {}\n", r, fmt::join(lists[r], " "));
    fmt::print("makespan: {:.3f} ms\n", stats.makespan * 1e3);
    fmt::print("bubble: simulated {:.4f} ({:.2f}%), formula {:.4f} ({:.2f}%)\n", stats.bubble_fraction,
               100 * stats.bubble_fraction, formula, 100 * formula);
    fmt::print("peak activations (micro-batch-stages held at once) per rank, simulated / bound:");
    for (size_t r = 0; r < bound.size(); ++r) fmt::print(" {}/{}", stats.peak_activations[r], bound[r]);
    fmt::print("\n");
  }
  if (!o.svg.empty()) {
    const std::string title = fmt::format("{} pipeline schedule: P = {}, M = {}, V = {}",
                                          pipeline::schedule_name(spec.kind), spec.ranks, spec.micro_batches,
                                          spec.virtual_stages);
    const std::string svg = pipeline::timeline_svg({{"ideal", timeline, spec.ranks}}, title);
    if (const Status st = write_file_atomic(o.svg, {svg}); !st.ok()) {
      fmt::print(stderr, "kiln plan pp: --svg: {}\n", st.message());
      return kUserError;
    }
    if (!o.json) fmt::print("timeline: {}\n", o.svg);
  }
  return 0;
}

}  // namespace

void register_plan_pp(CLI::App& app) {
  CLI::App* plan = app.get_subcommand("plan");  // created by register_comm
  auto opt = std::make_shared<PlanPpOptions>();
  CLI::App* cmd = plan->add_subcommand(
      "pp", "A pipeline schedule's per-rank action lists, its ideal bubble beside the formula and its peak "
            "activations beside the bound; --svg draws the timeline");
  cmd->add_option("--ranks", opt->ranks, "Pipeline ranks P")->required()->check(CLI::Range(1, 1024));
  cmd->add_option("--micro-batches", opt->micro_batches, "Micro-batches per step M (default 4)")
      ->check(CLI::Range(1, 16384));
  cmd->add_option("--schedule", opt->schedule, "gpipe, 1f1b (default), interleaved, zb-h1");
  CLI::Option* v = cmd->add_option("--virtual-stages", opt->virtual_stages,
                                   "Model chunks per rank V (default 1; 2 for interleaved)");
  v->check(CLI::Range(1, 64));
  cmd->add_option("--forward-ms", opt->forward_ms, "Forward of one micro-batch on one stage, ms (default 1)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--backward-ms", opt->backward_ms,
                  "Backward (B + W) of one micro-batch on one stage, ms (default 2; zb-h1 splits it in half)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--weight-ms", opt->weight_ms, "zb-h1: the weight-gradient part W of --backward-ms, ms")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--comm-ms", opt->comm_ms, "A send's start to its receive's end, ms (default 0)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--svg", opt->svg, "Write the ideal timeline here");
  cmd->add_flag("--json", opt->json, "One JSON object");
  cmd->callback([opt, v] {
    const int rc = run_plan_pp(*opt, v->count() > 0);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace kiln::app
