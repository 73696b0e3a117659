// Sender x receiver traffic heatmap as a standalone SVG (wsync plan --heatmap).
// Rows are trainer ranks, columns inference ranks; cell colour is bytes on a
// linear white -> dark-blue scale, with the scale printed beside the grid.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "routing/plan_summary.h"

namespace wsync {
namespace {

std::string Hex(double t) {  // t in [0,1] -> white..#08306b
  t = std::clamp(t, 0.0, 1.0);
  auto lerp = [&](int a, int b) { return static_cast<int>(a + (b - a) * t + 0.5); };
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", lerp(0xff, 0x08), lerp(0xff, 0x30), lerp(0xff, 0x6b));
  return buf;
}

std::string Gb(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GB", b / 1e9);
  return buf;
}

}  // namespace

std::string RenderTrafficHeatmapSvg(const RoutingTable& table) {
  const size_t nt = std::max<size_t>(1, table.trainer_endpoints.size());
  const size_t ni = std::max<size_t>(1, table.inference_endpoints.size());
  // Keep the picture under ~1000 px a side: group ranks into buckets.
  const size_t row_group = (nt + 511) / 512;
  const size_t col_group = (ni + 511) / 512;
  const size_t rows = (nt + row_group - 1) / row_group;
  const size_t cols = (ni + col_group - 1) / col_group;
  std::vector<double> cell(rows * cols, 0.0);
  for (const WriteOp& op : table.ops) {
    cell[(op.src_rank / row_group) * cols + op.dst_rank / col_group] += static_cast<double>(op.bytes);
  }
  const double max_cell = std::max(1.0, *std::max_element(cell.begin(), cell.end()));

  const double cw = std::clamp(900.0 / static_cast<double>(cols), 1.0, 24.0);
  const double ch = std::clamp(900.0 / static_cast<double>(rows), 1.0, 24.0);
  const double left = 70, top = 50;
  const double grid_w = cw * cols, grid_h = ch * rows;
  const double width = left + grid_w + 140, height = top + grid_h + 50;

  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
      << "' font-family='sans-serif' font-size='12'>\n";
  svg << "<rect width='100%' height='100%' fill='white'/>\n";
  svg << "<text x='" << left << "' y='20' font-size='14'>bytes per update: trainer rank (rows) x "
         "inference rank (columns)";
  if (row_group > 1 || col_group > 1) svg << ", " << row_group << "x" << col_group << " ranks per cell";
  svg << "</text>\n";
  svg << "<text x='" << left << "' y='38' fill='#555'>" << nt << " senders, " << ni
      << " receivers, max cell " << Gb(max_cell) << "</text>\n";
  svg << "<g shape-rendering='crispEdges'>\n";
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const double v = cell[r * cols + c];
      if (v <= 0) continue;
      svg << "<rect x='" << left + c * cw << "' y='" << top + r * ch << "' width='" << cw
          << "' height='" << ch << "' fill='" << Hex(v / max_cell) << "'/>\n";
    }
  }
  svg << "</g>\n";
  svg << "<rect x='" << left << "' y='" << top << "' width='" << grid_w << "' height='" << grid_h
      << "' fill='none' stroke='#888'/>\n";
  // Axis labels at a few ticks.
  const size_t row_ticks = std::min<size_t>(rows, 8), col_ticks = std::min<size_t>(cols, 8);
  for (size_t i = 0; i < row_ticks; ++i) {
    const size_t r = i * rows / row_ticks;
    svg << "<text x='" << left - 6 << "' y='" << top + r * ch + ch / 2 + 4
        << "' text-anchor='end'>t" << r * row_group << "</text>\n";
  }
  for (size_t i = 0; i < col_ticks; ++i) {
    const size_t c = i * cols / col_ticks;
    svg << "<text x='" << left + c * cw + cw / 2 << "' y='" << top + grid_h + 16
        << "' text-anchor='middle'>i" << c * col_group << "</text>\n";
  }
  // Colour scale.
  const double sx = left + grid_w + 30;
  for (int i = 0; i < 100; ++i) {
    svg << "<rect x='" << sx << "' y='" << top + (99 - i) * 2 << "' width='16' height='2' fill='"
        << Hex(i / 99.0) << "'/>\n";
  }
  svg << "<text x='" << sx + 22 << "' y='" << top + 8 << "'>" << Gb(max_cell) << "</text>\n";
  svg << "<text x='" << sx + 22 << "' y='" << top + 200 << "'>0</text>\n";
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace wsync
