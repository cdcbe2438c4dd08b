// DeviceMesh: checks, coordinates and one split per axis (mesh.h).
#include "kiln/comm/mesh.h"

#include <fmt/format.h>

namespace kiln::comm {

Expected<std::unique_ptr<DeviceMesh>> DeviceMesh::create(Communicator& world, std::vector<MeshAxis> axes) {
  int64_t product = 1;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i].name.empty()) return invalid_argument("[mesh] axis {} has no name", i);
    if (axes[i].size < 1) return invalid_argument("[mesh] axis {} has size {}; sizes are >= 1", axes[i].name, axes[i].size);
    for (size_t j = 0; j < i; ++j)
      if (axes[j].name == axes[i].name) return invalid_argument("[mesh] axis {} appears twice", axes[i].name);
    product *= axes[i].size;
  }
  std::unique_ptr<DeviceMesh> m(new DeviceMesh(world, std::move(axes)));
  if (product != world.size())
    return invalid_argument("the mesh {} has {} ranks but the job has {} (mpirun -np): the axis sizes must multiply "
                            "to the number of ranks",
                            m->describe(), product, world.size());
  // Row-major coordinates, last axis fastest.
  const int n = static_cast<int>(m->axes_.size());
  m->coords_.assign(static_cast<size_t>(n), 0);
  for (int i = n - 1, r = world.rank(); i >= 0; --i) {
    m->coords_[static_cast<size_t>(i)] = r % m->axes_[static_cast<size_t>(i)].size;
    r /= m->axes_[static_cast<size_t>(i)].size;
  }
  // Axis i's group: the ranks with the same coordinates on every other axis; ordered by the
  // coordinate on axis i.
  for (int i = 0; i < n; ++i) {
    int color = 0;
    for (int j = 0; j < n; ++j)
      if (j != i) color = color * m->axes_[static_cast<size_t>(j)].size + m->coords_[static_cast<size_t>(j)];
    KILN_ASSIGN_OR_RETURN(auto c, world.split(color, m->coords_[static_cast<size_t>(i)]));
    m->comms_.push_back(std::move(c));
  }
  return m;
}

int DeviceMesh::index(std::string_view axis) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == axis) return static_cast<int>(i);
  KILN_CHECK_MSG(false, "the mesh {} has no axis {}", describe(), axis);
  return -1;
}

Communicator& DeviceMesh::comm(std::string_view axis) { return *comms_[static_cast<size_t>(index(axis))]; }
int DeviceMesh::coord(std::string_view axis) const { return coords_[static_cast<size_t>(index(axis))]; }
int DeviceMesh::size(std::string_view axis) const { return axes_[static_cast<size_t>(index(axis))].size; }

std::string DeviceMesh::describe() const {
  std::string s;
  for (const MeshAxis& a : axes_) s += fmt::format("{}{} {}", s.empty() ? "" : " × ", a.name, a.size);
  return s.empty() ? "(no axes)" : s;
}

}  // namespace kiln::comm
