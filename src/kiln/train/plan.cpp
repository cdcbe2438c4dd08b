// The trivial plan (plan.h).
#include "kiln/train/plan.h"

namespace kiln {

double ParallelPlan::forward_backward(Transformer& model, const int32_t* tokens, const int32_t* targets, int64_t rows,
                                      int64_t seq_len, float loss_scale) {
  const double loss = model.forward(tokens, targets, rows, seq_len).value();
  model.backward(loss_scale);
  return loss;
}

double ParallelPlan::forward_loss(Transformer& model, const int32_t* tokens, const int32_t* targets, int64_t rows,
                                  int64_t seq_len) {
  return model.forward(tokens, targets, rows, seq_len).value();
}

std::vector<OptimizerPiece> whole_model_pieces(Transformer& model) {
  std::vector<OptimizerPiece> out;
  for (const ParamEntry& e : model.param_entries()) {
    OptimizerPiece p;
    p.params = model.params().data() + e.offset;
    p.grads = model.grads().data() + e.offset;
    p.n = e.shape.numel();
    p.state_offset = p.flat_begin = e.offset;
    p.decay = e.decay;
    out.push_back(p);
  }
  return out;
}

void SingleProcessPlan::attach(Transformer& model) {
  model_ = &model;
  pieces_ = whole_model_pieces(model);
}

}  // namespace kiln
