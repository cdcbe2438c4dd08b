// The GPU execution model of gpu_model.h: occupancy with the hardware's allocation rules, waves,
// Little's law, coalescing and bank-conflict counters, the ptxas / cuobjdump resource-usage
// parsers and the join of the CUDA catalog's launches with them. The specs table is gpu_specs.cpp.
#include "kiln/perf/gpu_model.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <memory>
#include <set>

namespace kiln::perf {
namespace {

// Allocation rules of compute capability 8.0 - 10.0 (CUDA occupancy calculator; cuda_occupancy.h
// of the toolkit states the same): registers go to warps in units of 256, from one of the SM's 4
// sub-partitions; shared memory goes to blocks in units of 128 bytes.
constexpr int kRegisterAllocUnit = 256;
constexpr int kSubPartitions = 4;
constexpr int64_t kSmemAllocUnit = 128;

constexpr int64_t round_up(int64_t x, int64_t unit) {
  return (x + unit - 1) / unit * unit;
}
constexpr int64_t ceil_div(int64_t x, int64_t y) {
  return (x + y - 1) / y;
}

}  // namespace

std::string_view occupancy_limiter_name(OccupancyLimiter l) {
  switch (l) {
    case OccupancyLimiter::kWarps:
      return "warps";
    case OccupancyLimiter::kRegisters:
      return "registers";
    case OccupancyLimiter::kSharedMemory:
      return "smem";
    case OccupancyLimiter::kBlocks:
      return "blocks";
  }
  return "?";
}

Expected<Occupancy> occupancy(const GpuSpec& gpu, const BlockResources& b) {
  if (b.threads_per_block < 1 || b.threads_per_block > gpu.max_threads_per_block)
    return invalid_argument("[occupancy] {} threads per block: {} allows 1..{}",
                            b.threads_per_block, gpu.full_name, gpu.max_threads_per_block);
  if (b.registers_per_thread < 0 || b.registers_per_thread > gpu.max_registers_per_thread)
    return invalid_argument("[occupancy] {} registers per thread: {} allows at most {}",
                            b.registers_per_thread, gpu.full_name, gpu.max_registers_per_thread);
  if (b.smem_per_block_bytes < 0 || b.smem_per_block_bytes > gpu.smem_per_block_bytes)
    return invalid_argument(
        "[occupancy] {} bytes of shared memory per block: {} allows at most {} "
        "(with the opt-in attribute)",
        b.smem_per_block_bytes, gpu.full_name, gpu.smem_per_block_bytes);
  Occupancy o;
  o.warps_per_block = static_cast<int>(ceil_div(b.threads_per_block, kWarpSize));
  o.blocks_by_warps = gpu.max_warps_per_sm() / o.warps_per_block;

  o.registers_known = b.registers_per_thread > 0;
  o.blocks_by_registers = INT_MAX;
  if (o.registers_known) {
    o.registers_per_warp =
        static_cast<int>(round_up(int64_t{b.registers_per_thread} * kWarpSize, kRegisterAllocUnit));
    // The launch check assumes a block's warps fill whole rows of the 4 sub-partitions.
    const int64_t block_regs =
        int64_t{o.registers_per_warp} * round_up(o.warps_per_block, kSubPartitions);
    if (block_regs > gpu.registers_per_block)
      return invalid_argument(
          "[occupancy] {} registers × {} threads: the block needs {} registers, "
          "{} holds {} per block (too many resources requested for launch)",
          b.registers_per_thread, b.threads_per_block, block_regs, gpu.full_name,
          gpu.registers_per_block);
    const int warps_by_regs =
        kSubPartitions * (gpu.registers_per_sm / kSubPartitions / o.registers_per_warp);
    o.blocks_by_registers = warps_by_regs / o.warps_per_block;
  }

  o.smem_allocated_per_block =
      round_up(b.smem_per_block_bytes + gpu.smem_reserved_per_block_bytes, kSmemAllocUnit);
  o.blocks_by_smem = o.smem_allocated_per_block > 0
                         ? static_cast<int>(gpu.smem_per_sm_bytes / o.smem_allocated_per_block)
                         : INT_MAX;
  o.blocks_by_cap = gpu.max_blocks_per_sm;

  const std::pair<int, OccupancyLimiter> limits[] = {
      {o.blocks_by_warps, OccupancyLimiter::kWarps},
      {o.blocks_by_registers, OccupancyLimiter::kRegisters},
      {o.blocks_by_smem, OccupancyLimiter::kSharedMemory},
      {o.blocks_by_cap, OccupancyLimiter::kBlocks}};
  o.blocks_per_sm = INT_MAX;
  for (const auto& [blocks, limiter] : limits) {
    if (blocks < o.blocks_per_sm) o.blocks_per_sm = blocks, o.limiter = limiter;
  }
  o.warps_per_sm = o.blocks_per_sm * o.warps_per_block;
  o.fraction = static_cast<double>(o.warps_per_sm) / gpu.max_warps_per_sm();

  const int64_t smem_needed = o.blocks_per_sm * o.smem_allocated_per_block;
  o.smem_carveout_kib = gpu.smem_carveouts_kib.back();
  for (const int c : gpu.smem_carveouts_kib) {
    if (c * int64_t{1024} >= smem_needed) {
      o.smem_carveout_kib = c;
      break;
    }
  }
  return o;
}

Waves waves(int64_t grid_blocks, int num_sms, int blocks_per_sm) {
  Waves w;
  w.blocks = grid_blocks;
  w.blocks_per_wave = int64_t{num_sms} * blocks_per_sm;
  if (grid_blocks <= 0 || w.blocks_per_wave <= 0) return w;
  w.num_waves = ceil_div(grid_blocks, w.blocks_per_wave);
  w.last_wave_blocks = grid_blocks - (w.num_waves - 1) * w.blocks_per_wave;
  w.last_wave_efficiency = static_cast<double>(w.last_wave_blocks) / w.blocks_per_wave;
  w.efficiency = static_cast<double>(grid_blocks) / (w.num_waves * w.blocks_per_wave);
  return w;
}

LittlesLaw littles_law(const GpuSpec& gpu, double latency_s, double bytes_per_warp) {
  KILN_CHECK(latency_s > 0 && bytes_per_warp > 0);
  LittlesLaw l;
  l.latency_s = latency_s;
  l.bytes_in_flight = gpu.hbm_bytes_per_s * latency_s;
  l.bytes_in_flight_per_sm = l.bytes_in_flight / gpu.num_sms;
  l.bytes_per_warp = bytes_per_warp;
  l.warps_per_sm = l.bytes_in_flight_per_sm / bytes_per_warp;
  l.fraction_of_max_warps = l.warps_per_sm / gpu.max_warps_per_sm();
  return l;
}

namespace {
void check_warp_access(std::span<const uint64_t> addresses, int access_bytes) {
  KILN_CHECK_MSG(addresses.size() <= static_cast<size_t>(kWarpSize), "{} addresses for one warp",
                 addresses.size());
  KILN_CHECK_MSG(access_bytes == 1 || access_bytes == 2 || access_bytes == 4 || access_bytes == 8 ||
                     access_bytes == 16,
                 "access of {} bytes", access_bytes);
}
}  // namespace

Coalescing coalescing(std::span<const uint64_t> addresses, int access_bytes) {
  check_warp_access(addresses, access_bytes);
  std::set<uint64_t> sectors;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [first, last] byte of each lane
  for (const uint64_t a : addresses) {
    const uint64_t last = a + access_bytes - 1;
    for (uint64_t s = a / kSectorBytes; s <= last / kSectorBytes; ++s) sectors.insert(s);
    spans.emplace_back(a, last);
  }
  std::sort(spans.begin(), spans.end());
  Coalescing c;
  uint64_t covered_to = 0;  // one past the last byte counted
  for (const auto& [first, last] : spans) {
    const uint64_t from = std::max(first, covered_to);
    if (last + 1 > from) c.useful_bytes += static_cast<int64_t>(last + 1 - from);
    covered_to = std::max(covered_to, last + 1);
  }
  c.sectors = static_cast<int>(sectors.size());
  c.sector_bytes = int64_t{c.sectors} * kSectorBytes;
  c.efficiency = c.sector_bytes > 0 ? static_cast<double>(c.useful_bytes) / c.sector_bytes : 0;
  return c;
}

BankConflicts bank_conflicts(std::span<const uint64_t> addresses, int access_bytes) {
  check_warp_access(addresses, access_bytes);
  const size_t lanes_per_phase =
      access_bytes <= kBankWordBytes ? kWarpSize : kWarpSize / (access_bytes / kBankWordBytes);
  BankConflicts r;
  for (size_t p = 0; p < addresses.size(); p += lanes_per_phase) {
    std::set<uint64_t> words[kNumBanks];  // the distinct words each bank serves in this phase
    for (size_t i = p; i < std::min(addresses.size(), p + lanes_per_phase); ++i) {
      const uint64_t first = addresses[i] / kBankWordBytes;
      const uint64_t last = (addresses[i] + access_bytes - 1) / kBankWordBytes;
      for (uint64_t w = first; w <= last; ++w) words[w % kNumBanks].insert(w);
    }
    int degree = 0;
    for (const auto& bank : words) degree = std::max(degree, static_cast<int>(bank.size()));
    r.degree = std::max(r.degree, degree);
    r.wavefronts += degree;
  }
  return r;
}

// ---- Resource usage ------------------------------------------------------------------------

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// The leading decimal number of `s` (after blanks), or nullopt.
std::optional<int64_t> leading_int(std::string_view s) {
  s = trim(s);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end == s.data()) return std::nullopt;
  return v;
}

// The text between the first pair of single quotes after `from`, e.g. 'sm_90'.
std::string_view quoted(std::string_view line, size_t from = 0) {
  const size_t a = line.find('\'', from);
  if (a == std::string_view::npos) return {};
  const size_t b = line.find('\'', a + 1);
  return b == std::string_view::npos ? std::string_view{} : line.substr(a + 1, b - a - 1);
}

// f(piece) for each piece of `text` between `sep`s (a trailing empty piece included).
template <class F>
void for_each_piece(std::string_view text, char sep, F&& f) {
  for (;;) {
    const size_t at = text.find(sep);
    f(text.substr(0, at));
    if (at == std::string_view::npos) return;
    text.remove_prefix(at + 1);
  }
}

// "N bytes stack frame, N bytes spill stores, N bytes spill loads"
void parse_stack_line(std::string_view line, KernelResourceUsage& e) {
  for_each_piece(line, ',', [&](std::string_view part) {
    part = trim(part);
    if (const auto v = leading_int(part)) {
      if (part.ends_with("stack frame"))
        e.stack_bytes = *v;
      else if (part.ends_with("spill stores"))
        e.spill_store_bytes = *v;
      else if (part.ends_with("spill loads"))
        e.spill_load_bytes = *v;
    }
  });
}

// "Used 40 registers, used 1 barriers, 8192 bytes smem, 388 bytes cmem[0], 256 bytes cumulative
// stack size" (the fields vary with the version and arch).
void parse_used_line(std::string_view used, KernelResourceUsage& e) {
  for_each_piece(used, ',', [&](std::string_view part) {
    part = trim(part);
    if (part.starts_with("Used ") || part.starts_with("used ")) part.remove_prefix(5);
    if (const auto v = leading_int(part)) {
      if (part.ends_with(" registers"))
        e.registers = static_cast<int>(*v);
      else if (part.ends_with(" barriers"))
        e.barriers = static_cast<int>(*v);
      else if (part.ends_with(" bytes smem"))
        e.smem_bytes = *v;
      else if (part.ends_with(" bytes cmem[0]"))
        e.cmem0_bytes = *v;
    }
  });
}

// "REG:40 STACK:0 SHARED:8192 LOCAL:0 CONSTANT[0]:388 TEXTURE:0 ..."
void parse_cuobjdump_fields(std::string_view line, KernelResourceUsage& e) {
  for_each_piece(line, ' ', [&](std::string_view field) {
    const size_t colon = field.rfind(':');
    if (colon == std::string_view::npos) return;
    const std::string_view key = field.substr(0, colon);
    if (const auto v = leading_int(field.substr(colon + 1))) {
      if (key == "REG")
        e.registers = static_cast<int>(*v);
      else if (key == "STACK")
        e.stack_bytes = *v;
      else if (key == "SHARED")
        e.smem_bytes = *v;
      else if (key == "LOCAL")
        e.local_bytes = *v;
      else if (key == "CONSTANT[0]")
        e.cmem0_bytes = *v;
    }
  });
}

}  // namespace

std::vector<KernelResourceUsage> parse_ptxas_output(std::string_view text) {
  std::vector<KernelResourceUsage> out;
  std::optional<KernelResourceUsage> entry;  // between "Compiling entry function" and "Used"
  bool in_properties = false;                // the last "Function properties" was the entry's
  for_each_piece(text, '\n', [&](std::string_view line) {
    constexpr std::string_view kCompiling = "Compiling entry function ";
    constexpr std::string_view kProperties = "Function properties for ";
    if (const size_t at = line.find(kCompiling); at != std::string_view::npos) {
      const std::string_view sym = quoted(line, at);
      const size_t after = line.find(sym, at) + sym.size() + 1;
      entry = KernelResourceUsage{};
      entry->mangled = std::string(sym);
      entry->arch = std::string(quoted(line, after));
      in_properties = false;
    } else if (const size_t p = line.find(kProperties); p != std::string_view::npos) {
      in_properties = entry && trim(line.substr(p + kProperties.size())) == entry->mangled;
    } else if (line.find("bytes stack frame") != std::string_view::npos) {
      if (in_properties) parse_stack_line(line, *entry);
      in_properties = false;
    } else if (const size_t u = line.find("Used "); u != std::string_view::npos && entry) {
      parse_used_line(line.substr(u), *entry);
      entry->name = ptxas_kernel_name(entry->mangled);
      out.push_back(std::move(*entry));
      entry.reset();
    }
  });
  return out;
}

std::vector<KernelResourceUsage> parse_cuobjdump_resource_usage(std::string_view text) {
  std::vector<KernelResourceUsage> out;
  std::string arch;
  std::string function;  // the "Function SYM:" whose figures come next
  for_each_piece(text, '\n', [&](std::string_view raw) {
    const std::string_view line = trim(raw);
    if (line.starts_with("arch = ")) {
      arch = std::string(trim(line.substr(7)));
    } else if (line.starts_with("Function ") && line.ends_with(":")) {
      function = std::string(line.substr(9, line.size() - 10));
    } else if (line.starts_with("Common:")) {
      function.clear();
    } else if (line.starts_with("REG:") && !function.empty()) {
      KernelResourceUsage e;
      e.mangled = function;
      e.name = ptxas_kernel_name(function);
      e.arch = arch;
      parse_cuobjdump_fields(line, e);
      out.push_back(std::move(e));
      function.clear();
    }
  });
  return out;
}

std::vector<KernelResourceUsage> parse_resource_usage(std::string_view text) {
  const bool cuobjdump = text.find("Resource usage:") != std::string_view::npos ||
                         text.find("Fatbin elf code") != std::string_view::npos;
  return cuobjdump ? parse_cuobjdump_resource_usage(text) : parse_ptxas_output(text);
}

std::string ptxas_kernel_name(std::string_view mangled) {
  const std::string sym(mangled);
  int status = 0;
  const std::unique_ptr<char, decltype(&std::free)> demangled(
      abi::__cxa_demangle(sym.c_str(), nullptr, nullptr, &status), &std::free);
  if (status != 0 || !demangled) return sym;
  std::string_view s = demangled.get();
  // The parameter list: the parenthesis matching the final ')'.
  if (s.ends_with(")")) {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')')
        ++depth;
      else if (s[i] == '(' && --depth == 0) {
        s = s.substr(0, i);
        break;
      }
    }
  }
  // The return type (templates only): everything up to the last blank outside <> and ().
  int depth = 0;
  size_t name_at = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' || s[i] == '(')
      ++depth;
    else if (s[i] == '>' || s[i] == ')')
      --depth;
    else if (s[i] == ' ' && depth == 0)
      name_at = i + 1;
  }
  return std::string(s.substr(name_at));
}

// ---- Launches explained --------------------------------------------------------------------

namespace {
// 90 for "sm_90" and "sm_90a", 100 for "sm_100"; -1 when not an sm_ name.
int arch_number_of(std::string_view arch) {
  if (!arch.starts_with("sm_")) return -1;
  const auto v = leading_int(arch.substr(3));
  return v ? static_cast<int>(*v) : -1;
}
}  // namespace

LaunchReport explain_launches(const GpuSpec& gpu, std::span<const cuda::KernelLaunch> launches,
                              std::span<const KernelResourceUsage> usage) {
  LaunchReport r;
  r.target_arch = gpu.arch();
  const int target = gpu.arch_number();
  if (usage.empty() && !launches.empty())
    r.notes.push_back(
        "no resource usage at all: registers unknown, occupancy without the register limit");
  for (const cuda::KernelLaunch& l : launches) {
    LaunchRow row;
    row.launch = l;
    const KernelResourceUsage* best = nullptr;  // the GPU's arch, else the nearest lower one
    std::string seen;
    for (const KernelResourceUsage& e : usage) {
      if (e.name != l.kernel) continue;
      const int a = arch_number_of(e.arch);
      seen += (seen.empty() ? "" : ", ") + e.arch;
      if (a > target) continue;
      if (!best || a > arch_number_of(best->arch)) best = &e;
    }
    if (best) {
      row.usage = *best;
      row.arch_used = best->arch;
      const int used = arch_number_of(best->arch);
      // SASS runs only on its own major arch: across majors the driver JIT-compiles the PTX, and
      // that build's registers may differ.
      if (used != target)
        r.notes.push_back(fmt::format(
            "{}: no {} build, using the {} figures{}", l.kernel, r.target_arch, best->arch,
            used / 10 != target / 10 ? " (another major arch: it would run JIT-compiled "
                                       "from PTX, so they are an estimate)"
                                     : ""));
    } else if (!usage.empty()) {
      r.notes.push_back(
          seen.empty()
              ? fmt::format("{}: not in the resource-usage log (registers unknown)", l.kernel)
              : fmt::format("{}: built only for {} (none at or below {}; registers unknown)",
                            l.kernel, seen, r.target_arch));
    }
    row.smem_per_block_bytes = (row.usage ? row.usage->smem_bytes : 0) + l.dynamic_smem_bytes;
    Expected<Occupancy> o = occupancy(
        gpu, {l.threads_per_block, row.usage ? row.usage->registers : 0, row.smem_per_block_bytes});
    if (o.ok()) {
      row.occupancy = *o;
      row.waves = waves(l.grid_blocks, gpu.num_sms, o->blocks_per_sm);
    } else {
      row.error = o.status().message();
      row.waves.blocks = l.grid_blocks;
    }
    r.rows.push_back(std::move(row));
  }
  return r;
}

std::string format_launch_report(const LaunchReport& r) {
  std::string out = fmt::format(
      "{:<10} {:<30} {:>8} {:>6} {:>5} {:>12} {:>11} {:>6} {:>7} {:>6} {:>9} {:>5} {:>6}\n",
      "family", "variant", "grid", "thr", "regs", "smem st+dyn", "spill st/ld", "blk/SM", "warp/SM",
      "occ%", "limiter", "waves", "last%");
  for (const LaunchRow& row : r.rows) {
    const cuda::KernelLaunch& l = row.launch;
    const std::optional<KernelResourceUsage>& u = row.usage;
    const std::string regs = u ? fmt::format("{}", u->registers) : "?";
    const std::string smem =
        fmt::format("{}+{}", u ? fmt::format("{}", u->smem_bytes) : "?", l.dynamic_smem_bytes);
    const std::string spill =
        u && u->spill_store_bytes
            ? fmt::format("{}/{}", *u->spill_store_bytes, u->spill_load_bytes.value_or(0))
            : "-";
    out += fmt::format("{:<10} {:<30} {:>8} {:>6} {:>5} {:>12} {:>11} ", l.family, l.variant,
                       l.grid_blocks, l.threads_per_block, regs, smem, spill);
    if (!row.occupancy) {
      out += fmt::format("cannot launch: {}\n", row.error);
      continue;
    }
    const Occupancy& o = *row.occupancy;
    out += fmt::format("{:>6} {:>7} {:>5.1f}{} {:>9} {:>5} {:>6.1f}\n", o.blocks_per_sm,
                       o.warps_per_sm, 100 * o.fraction, o.registers_known ? " " : "*",
                       occupancy_limiter_name(o.limiter), row.waves.num_waves,
                       100 * row.waves.last_wave_efficiency);
  }
  for (const std::string& n : r.notes) out += fmt::format("note: {}\n", n);
  return out;
}

}  // namespace kiln::perf
