// Standalone SVG charts (no dependencies) for the pictures the CLI writes: loss curves,
// roofline plots, memory breakdowns. A chart is series of (x, y) points on linear or log axes.
#pragma once

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
};

std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& options);

}  // namespace kiln
