// SVG line charts: axes with "nice" ticks, one polyline (or markers) per series, a legend.
#include "kiln/perf/svg.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace kiln {
namespace {

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// Tick positions covering [lo, hi]: 1-2-5 steps on linear axes, powers of ten on log axes.
std::vector<double> ticks(double lo, double hi, bool log) {
  std::vector<double> t;
  if (log) {
    for (double p = std::floor(lo); p <= std::ceil(hi); p += 1) t.push_back(p);
    return t;
  }
  const double span = std::max(hi - lo, 1e-12);
  const double raw = span / 6, mag = std::pow(10, std::floor(std::log10(raw)));
  const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
  for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) t.push_back(v);
  return t;
}

std::string label(double v, bool log) {
  if (log) v = std::pow(10, v);
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) return fmt::format("{:.0e}", v);
  return fmt::format("{:g}", v);
}

}  // namespace

std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& o) {
  const double left = 70, right = 20, top = 40, bottom = 55;
  const double pw = o.width - left - right, ph = o.height - top - bottom;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  auto tx = [&](double x) { return o.log_x ? std::log10(std::max(x, 1e-300)) : x; };
  auto ty = [&](double y) { return o.log_y ? std::log10(std::max(y, 1e-300)) : y; };
  for (const Series& s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, tx(x)); x1 = std::max(x1, tx(x));
      y0 = std::min(y0, ty(y)); y1 = std::max(y1, ty(y));
    }
  if (!std::isfinite(x0)) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double ypad = (y1 - y0) * 0.05;
  y0 -= ypad; y1 += ypad;
  auto px = [&](double x) { return left + (tx(x) - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + ph - (ty(y) - y0) / (y1 - y0) * ph; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      o.width, o.height);
  svg += fmt::format("<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", o.width / 2,
                     escape(o.title));
  for (double t : ticks(x0, x1, o.log_x)) {
    const double x = left + (t - x0) / (x1 - x0) * pw;
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
                       x, top, top + ph, top + ph + 16, label(t, o.log_x));
  }
  for (double t : ticks(y0, y1, o.log_y)) {
    const double y = top + ph - (t - y0) / (y1 - y0) * ph;
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
                       "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                       left, y, left + pw, left - 6, y + 4, label(t, o.log_y));
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", left,
                     top, pw, ph);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", left + pw / 2, o.height - 12,
                     escape(o.x_label));
  svg += fmt::format("<text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
                     top + ph / 2, escape(o.y_label));
  const double legend_x = o.legend_left ? left + 10 : left + pw - 170;
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const std::string color = s.color.empty() ? kPalette[i % std::size(kPalette)] : s.color;
    if (s.markers) {
      const auto labels = o.point_labels.find(s.name);
      for (size_t k = 0; k < s.points.size(); ++k) {
        const auto [x, y] = s.points[k];
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(x), py(y), color);
        if (labels != o.point_labels.end() && k < labels->second.size())
          svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\">{}</text>\n", px(x) + 5, py(y) - 4,
                             escape(labels->second[k]));
      }
    } else {
      std::string pts;
      for (auto [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y)) pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
      svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n", color, pts);
    }
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{}\"/>"
                       "<text x=\"{}\" y=\"{}\">{}</text>\n",
                       legend_x, top + 12 + 16 * i, color, legend_x + 18, top + 17 + 16 * i, escape(s.name));
  }
  return svg + "</svg>\n";
}

std::string stacked_bar_svg(const std::vector<Bar>& bars, const ChartOptions& o) {
  const double left = 70, right = 240, top = 40, bottom = 70;
  const double pw = o.width - left - right, ph = o.height - top - bottom;
  std::vector<std::string> names, colors;  // legend order: first appearance
  auto color_of = [&](const BarSegment& seg) {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == seg.name) return colors[i];
    names.push_back(seg.name);
    colors.push_back(seg.color.empty() ? kPalette[(names.size() - 1) % std::size(kPalette)] : seg.color);
    return colors.back();
  };
  double ymax = 0;
  for (const Bar& b : bars) {
    double sum = 0;
    for (const BarSegment& seg : b.segments) sum += std::max(0.0, seg.value);
    ymax = std::max(ymax, sum);
  }
  if (ymax <= 0) ymax = 1;
  const std::vector<double> yt = ticks(0, ymax * 1.05, false);
  const double ytop = std::max(ymax * 1.05, yt.empty() ? ymax : yt.back());
  auto py = [&](double y) { return top + ph - y / ytop * ph; };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      o.width, o.height);
  svg += fmt::format("<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
                     o.width / 2, escape(o.title));
  for (double t : yt) {
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
                       "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                       left, py(t), left + pw, left - 6, py(t) + 4, label(t, false));
  }
  const double slot = bars.empty() ? pw : pw / static_cast<double>(bars.size());
  const double bw = std::min(60.0, slot * 0.6);
  for (size_t i = 0; i < bars.size(); ++i) {
    const double x = left + slot * (static_cast<double>(i) + 0.5) - bw / 2;
    double y = 0;
    for (const BarSegment& seg : bars[i].segments) {
      const double v = std::max(0.0, seg.value);
      const std::string color = color_of(seg);
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
                         "<title>{}: {:g}</title></rect>\n",
                         x, py(y + v), bw, py(y) - py(y + v), color, escape(seg.name), v);
      y += v;
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:g}</text>\n", x + bw / 2,
                       py(y) - 4, std::round(y * 10) / 10);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x + bw / 2,
                       top + ph + 16, escape(bars[i].label));
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", left,
                     top, pw, ph);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", left + pw / 2, o.height - 12,
                     escape(o.x_label));
  svg += fmt::format("<text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
                     top + ph / 2, escape(o.y_label));
  for (size_t i = names.size(); i-- > 0;) {  // top of the stack first, as drawn
    const double ly = top + 12 + 16 * static_cast<double>(names.size() - 1 - i);
    svg += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
                       "<text x=\"{}\" y=\"{:.1f}\">{}</text>\n",
                       left + pw + 14, ly - 10, colors[i], left + pw + 32, ly, escape(names[i]));
  }
  return svg + "</svg>\n";
}

}  // namespace kiln
