// Standalone SVG charts (no dependencies) for the pictures the CLI writes: loss curves,
// roofline plots, memory breakdowns. A chart is series of (x, y) points on linear or log axes.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
  std::string color;     // CSS color; empty: from a fixed palette
  bool markers = false;  // draw points instead of a line
};

struct ChartOptions {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  int width = 720, height = 420;
  bool legend_left = false;  // legend in the top-left corner (a roofline's empty one), else top-right
  // Text beside each point of a markers series, by the series' name (a roofline's op names).
  std::map<std::string, std::vector<std::string>> point_labels;
};

std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& options);

// Stacked bars: one bar per entry, its segments stacked bottom-up in order; segments with the
// same name share a color and one legend entry (e.g. a memory breakdown per configuration).
struct BarSegment {
  std::string name;
  double value = 0;
  std::string color;  // empty: from the palette, by the name's first appearance
};
struct Bar {
  std::string label;
  std::vector<BarSegment> segments;
};
std::string stacked_bar_svg(const std::vector<Bar>& bars, const ChartOptions& options);

}  // namespace kiln
