// The elementwise fusion pass (graph_fusion.h).
#include "kiln/perf/graph_fusion.h"

#include <cstring>
#include <map>
#include <memory>

namespace kiln::perf {
namespace {

using fusion::Chain;
using fusion::Ref;

// An elementwise node: its op, the arrays it reads and writes (elements), the length; a bias
// add also its grid (its second read is a row of `cols`, broadcast over the rows).
struct Elementwise {
  fusion::OpKind kind = fusion::OpKind::kAdd;
  std::vector<const void*> reads;
  const void* write = nullptr;
  int64_t n = 0;
  float imm = 0;
  int64_t bias_cols = 0;  // > 0: reads[1] is a (cols,) bias
};

bool as_elementwise(const graph::Node& node, Elementwise& e) {
  const std::string_view name = node.name;
  const auto& io = node.io;
  auto len = [&](size_t i) { return io[i].bytes / static_cast<int64_t>(sizeof(float)); };
  if (name == "add" || name == "swiglu_forward") {
    e = {name == "add" ? fusion::OpKind::kAdd : fusion::OpKind::kSwiglu, {io[1].ptr, io[2].ptr}, io[0].ptr, len(0)};
  } else if (name == "scale") {
    e = {fusion::OpKind::kScale, {io[1].ptr}, io[0].ptr, len(0), node.scalar};
  } else if (name == "accumulate") {  // y += x
    e = {fusion::OpKind::kAdd, {io[0].ptr, io[2].ptr}, io[0].ptr, len(0)};
  } else if (name == "gelu_forward" || name == "silu_forward") {
    e = {name == "gelu_forward" ? fusion::OpKind::kGeluTanh : fusion::OpKind::kSilu, {io[1].ptr}, io[0].ptr, len(0)};
  } else if (name == "add_bias") {  // out (rows, cols) = x + bias (cols,)
    e = {fusion::OpKind::kAdd, {io[1].ptr, io[2].ptr}, io[0].ptr, len(0), 0, len(2)};
    if (e.bias_cols < 1 || e.n % e.bias_cols != 0) return false;
  } else {
    return false;
  }
  for (size_t i = 0; i < io.size(); ++i)  // all of one length, but a bias
    if (io[i].bytes != e.n * static_cast<int64_t>(sizeof(float)) && !(e.bias_cols > 0 && i == 2)) return false;
  return e.n > 0;
}

}  // namespace

FusionReport fuse_elementwise(graph::Graph& g, fusion::KernelCache& cache) {
  FusionReport report;
  for (size_t first = 0; first < g.nodes().size(); ++first) {
    Elementwise e;
    if (!as_elementwise(g.nodes()[first], e)) continue;
    // Grow the run: same length, each node reading something the run wrote.
    std::vector<Elementwise> run = {e};
    std::map<const void*, int> written = {{e.write, 0}};
    int64_t bias_cols = e.bias_cols;  // the run's biases' width (0: none yet); one grid per run
    for (size_t i = first + 1; i < g.nodes().size(); ++i) {
      Elementwise next;
      if (!as_elementwise(g.nodes()[i], next) || next.n != e.n) break;
      if (next.bias_cols > 0 && bias_cols > 0 && next.bias_cols != bias_cols) break;  // two grids
      if (next.bias_cols > 0) bias_cols = next.bias_cols;
      bool reads_run = false;
      for (const void* r : next.reads) reads_run |= written.count(r) > 0;
      if (!reads_run) break;
      written[next.write] = static_cast<int>(run.size());
      run.push_back(next);
    }
    if (run.size() < 2) continue;
    const size_t count = run.size(), after = first + count;
    const int64_t cols = bias_cols > 0 ? bias_cols : e.n;  // the grid: (n / cols, cols)
    const int64_t bytes = e.n * static_cast<int64_t>(sizeof(float));
    // The chain: external arrays become inputs, each node an op; a written array is an output
    // when the graph keeps it or a later node touches it.
    Chain chain;
    chain.math = fusion::Math::kPolynomial;
    std::vector<const void*> in_ptrs;
    std::vector<int64_t> in_bytes;
    std::map<const void*, Ref> value;  // the array's current value inside the run
    auto ref_of = [&](const void* p, bool bias) {
      if (auto it = value.find(p); it != value.end()) return it->second;
      in_ptrs.push_back(p);
      in_bytes.push_back(bias ? cols * static_cast<int64_t>(sizeof(float)) : bytes);
      return value[p] = chain.input(bias ? fusion::Layout::kPerCol : fusion::Layout::kFull);
    };
    std::string text;
    for (size_t k = 0; k < count; ++k) {
      const Elementwise& x = run[k];
      Ref a = ref_of(x.reads[0], false), b = x.reads.size() > 1 ? ref_of(x.reads[1], x.bias_cols > 0) : Ref{};
      value[x.write] = chain.op(x.kind, a, b, {}, x.imm);
      text += (k ? " > " : "") + std::string(g.nodes()[first + k].name);
    }
    std::vector<void*> out_ptrs;
    for (const auto& [p, last] : written) {
      bool live = g.kept(p, bytes);
      for (size_t i = after; !live && i < g.nodes().size(); ++i) live = graph::touches(g.nodes()[i], p, bytes);
      if (!live) continue;
      int alias = -1;
      for (size_t j = 0; j < in_ptrs.size(); ++j)
        if (in_ptrs[j] == p) alias = static_cast<int>(j);
      chain.output(value[p], alias);
      out_ptrs.push_back(const_cast<void*>(p));
    }
    if (out_ptrs.empty()) continue;  // nothing of it is used: leave it to eager semantics
    Expected<fusion::FusedKernel> kernel = cache.get(chain);
    if (!kernel.ok()) {
      fusion::warn_once_fallback(kernel.status());
      report.fallback = kernel.status().message();
      return report;
    }
    graph::Node fused;
    fused.name = "fused_elementwise";
    for (size_t j = 0; j < in_ptrs.size(); ++j) fused.io.push_back(graph::reads_bytes(in_ptrs[j], in_bytes[j]));
    for (void* p : out_ptrs) fused.io.push_back(graph::writes_bytes(p, bytes));
    const size_t num_in = in_ptrs.size(), num_out = out_ptrs.size();
    const int64_t rows = e.n / cols;
    fused.fn = [k = *kernel, num_in, num_out, rows, cols](const graph::Access* io) {
      const float* in[fusion::kMaxInputs];
      float* out[fusion::kMaxOutputs];
      for (size_t j = 0; j < num_in; ++j) in[j] = io[j].as<float>();
      for (size_t j = 0; j < num_out; ++j) out[j] = io[num_in + j].mut<float>();
      k(in, out, rows, cols);
    };
    g.replace(first, count, std::move(fused));
    ++report.chains;
    report.nodes_fused += static_cast<int>(count);
    report.fused.push_back(text);
  }
  return report;
}

graph::GraphPass fusion_pass(std::function<void(const FusionReport&)> log) {
  static auto cache = std::make_shared<fusion::KernelCache>();
  return [log = std::move(log)](graph::Graph& g) -> int64_t {
    const FusionReport r = fuse_elementwise(g, *cache);
    if (log) log(r);
    return r.nodes_fused - r.chains;
  };
}

}  // namespace kiln::perf
