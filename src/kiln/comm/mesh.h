// DeviceMesh: the world's ranks laid out on named axes (dp, tp, pp, ep, cp, or a layout's own,
// such as HSDP's replicate × shard), row-major with the last axis fastest: with axes
// (dp 2, tp 2), world ranks 0 and 1 share dp coordinate 0 and differ in tp. Each axis has its
// communicator, built from the world by split: the ranks that agree on every other axis.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/comm/communicator.h"

namespace kiln::comm {

struct MeshAxis {
  std::string name;
  int size = 1;
};

class DeviceMesh {
 public:
  // Checks first, with no communication, so every rank returns the same error: each size is
  // >= 1, names are distinct and non-empty, and the sizes multiply to world.size() (the error
  // names the axes and the world size). Then collective over `world`: one split per axis.
  static Expected<std::unique_ptr<DeviceMesh>> create(Communicator& world, std::vector<MeshAxis> axes);

  const std::vector<MeshAxis>& axes() const { return axes_; }
  // The axis's communicator, this rank's coordinate on it and its size. The name must be an
  // axis of the mesh (a programming error otherwise).
  Communicator& comm(std::string_view axis);
  int coord(std::string_view axis) const;
  int size(std::string_view axis) const;
  Communicator& world() { return world_; }
  // "dp 2 × tp 2" (for messages and reports).
  std::string describe() const;

 private:
  DeviceMesh(Communicator& world, std::vector<MeshAxis> axes) : world_(world), axes_(std::move(axes)) {}
  int index(std::string_view axis) const;
  Communicator& world_;
  std::vector<MeshAxis> axes_;
  std::vector<int> coords_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace kiln::comm
