// CPU kernels for packed embedding tables: pooled lookup, and the backward pass fused with
// a sparse optimizer step. The definition they implement is kernels/reference.py.
//
// Threads: ATen's parallel_for, i.e. torch's own OpenMP runtime and thread count, so the
// kernels never bring a second OpenMP runtime into the process.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kGrainBags = 2048;
constexpr int64_t kGrainRows = 256;

// Where each bag's kept ids start and stop, after max_len truncation, and its pooling scale.
struct Bags {
  std::vector<int64_t> start, stop;
  std::vector<float> scale;
};

template <typename offset_t>
Bags describe_bags(const torch::Tensor& offsets, int64_t num_ids, int64_t num_fields,
                   const torch::Tensor& mean_pooled, const torch::Tensor& max_len) {
  const int64_t num_bags = offsets.size(0);
  const offset_t* off = offsets.data_ptr<offset_t>();
  const bool* mean = mean_pooled.numel() ? mean_pooled.data_ptr<bool>() : nullptr;
  const int64_t* limit = max_len.numel() ? max_len.data_ptr<int64_t>() : nullptr;
  Bags bags{std::vector<int64_t>(num_bags), std::vector<int64_t>(num_bags), std::vector<float>(num_bags, 1.0f)};
  at::parallel_for(0, num_bags, kGrainBags * 8, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t field = b % num_fields;
      const int64_t start = off[b];
      int64_t stop = b + 1 < num_bags ? static_cast<int64_t>(off[b + 1]) : num_ids;
      if (limit) stop = std::min(stop, start + limit[field]);
      bags.start[b] = start;
      bags.stop[b] = stop;
      if (mean && mean[field] && stop > start) bags.scale[b] = 1.0f / static_cast<float>(stop - start);
    }
  });
  return bags;
}

Bags bags_of(const torch::Tensor& offsets, int64_t num_ids, int64_t num_fields,
             const torch::Tensor& mean_pooled, const torch::Tensor& max_len) {
  if (offsets.scalar_type() == torch::kInt32)
    return describe_bags<int32_t>(offsets, num_ids, num_fields, mean_pooled, max_len);
  return describe_bags<int64_t>(offsets, num_ids, num_fields, mean_pooled, max_len);
}

void check_inputs(const torch::Tensor& weight, const torch::Tensor& ids, const torch::Tensor& offsets,
                  int64_t num_fields) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat32 && weight.is_contiguous(),
              "weight must be a contiguous float32 (rows, dim) tensor");
  TORCH_CHECK(ids.scalar_type() == torch::kInt64 && ids.is_contiguous(), "ids must be contiguous int64");
  TORCH_CHECK(offsets.is_contiguous() &&
                  (offsets.scalar_type() == torch::kInt32 || offsets.scalar_type() == torch::kInt64),
              "offsets must be contiguous int32 or int64");
  TORCH_CHECK(num_fields > 0 && offsets.size(0) % num_fields == 0, "offsets must hold samples x fields bags");
}

}  // namespace

torch::Tensor lookup(torch::Tensor weight, torch::Tensor ids, torch::Tensor offsets, int64_t num_fields,
                     torch::Tensor mean_pooled, torch::Tensor max_len) {
  check_inputs(weight, ids, offsets, num_fields);
  const int64_t num_bags = offsets.size(0), dim = weight.size(1);
  const Bags bags = bags_of(offsets, ids.numel(), num_fields, mean_pooled, max_len);
  auto out = torch::zeros({num_bags / num_fields, num_fields, dim}, weight.options());
  const float* w = weight.data_ptr<float>();
  const int64_t* id = ids.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, num_bags, kGrainBags, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* row_out = o + b * dim;
      for (int64_t k = bags.start[b]; k < bags.stop[b]; ++k) {
        const float* row = w + id[k] * dim;
        for (int64_t d = 0; d < dim; ++d) row_out[d] += row[d];
      }
      if (bags.scale[b] != 1.0f)
        for (int64_t d = 0; d < dim; ++d) row_out[d] *= bags.scale[b];
    }
  });
  return out;
}

// Backward of lookup fused with the optimizer: each touched row's gradient is summed over
// its occurrences and applied once; no (rows, dim) gradient is ever built.
//
// `slot_of_row` is caller-owned scratch, one int32 per table row, all -1 on entry and on
// exit: it de-duplicates ids in one pass without sorting.
void fused_update(torch::Tensor weight, std::vector<torch::Tensor> slots, torch::Tensor ids, torch::Tensor offsets,
                  torch::Tensor grad, int64_t num_fields, std::string optimizer, double lr, double eps, double beta1,
                  double beta2, int64_t step, torch::Tensor mean_pooled, torch::Tensor max_len,
                  torch::Tensor slot_of_row) {
  check_inputs(weight, ids, offsets, num_fields);
  TORCH_CHECK(grad.is_contiguous() && grad.scalar_type() == torch::kFloat32, "grad must be contiguous float32");
  TORCH_CHECK(slot_of_row.numel() >= weight.size(0) && slot_of_row.scalar_type() == torch::kInt32,
              "slot_of_row must be int32 scratch with one entry per row");
  const int64_t num_bags = offsets.size(0), dim = weight.size(1);
  const Bags bags = bags_of(offsets, ids.numel(), num_fields, mean_pooled, max_len);
  const int64_t* id = ids.data_ptr<int64_t>();
  int32_t* slot = slot_of_row.data_ptr<int32_t>();

  // 1. De-duplicate: unique rows in first-seen order, and how often each occurs.
  std::vector<int64_t> unique_rows;
  std::vector<int32_t> occurrence_slot;
  std::vector<int64_t> counts;
  occurrence_slot.reserve(ids.numel());
  for (int64_t b = 0; b < num_bags; ++b) {
    for (int64_t k = bags.start[b]; k < bags.stop[b]; ++k) {
      int32_t s = slot[id[k]];
      if (s < 0) {
        s = static_cast<int32_t>(unique_rows.size());
        slot[id[k]] = s;
        unique_rows.push_back(id[k]);
        counts.push_back(0);
      }
      occurrence_slot.push_back(s);
      ++counts[s];
    }
  }
  const int64_t num_unique = static_cast<int64_t>(unique_rows.size());

  // 2. Group occurrences by row (a counting sort): row u's bags are bag_of[first[u]:first[u+1]].
  std::vector<int64_t> first(num_unique + 1, 0);
  for (int64_t u = 0; u < num_unique; ++u) first[u + 1] = first[u] + counts[u];
  std::vector<int64_t> cursor(first.begin(), first.end() - 1);
  std::vector<int64_t> bag_of(occurrence_slot.size());
  int64_t j = 0;
  for (int64_t b = 0; b < num_bags; ++b)
    for (int64_t k = bags.start[b]; k < bags.stop[b]; ++k) bag_of[cursor[occurrence_slot[j++]]++] = b;

  // 3. Per unique row, in parallel: sum its gradient, then step the row and its slots.
  float* w = weight.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  const int kind = optimizer == "sgd" ? 0 : optimizer == "adagrad" ? 1 : 2;
  TORCH_CHECK(optimizer == "sgd" || optimizer == "adagrad" || optimizer == "adam", "unknown optimizer ", optimizer);
  float* state = kind == 1 ? slots.at(0).data_ptr<float>() : nullptr;
  float* m = kind == 2 ? slots.at(0).data_ptr<float>() : nullptr;
  float* v = kind == 2 ? slots.at(1).data_ptr<float>() : nullptr;
  const float flr = static_cast<float>(lr), feps = static_cast<float>(eps);
  const float fb1 = static_cast<float>(beta1), fb2 = static_cast<float>(beta2);
  const float bias1 = kind == 2 ? static_cast<float>(1.0 - std::pow(beta1, step)) : 1.0f;
  const float bias2 = kind == 2 ? static_cast<float>(1.0 - std::pow(beta2, step)) : 1.0f;
  at::parallel_for(0, num_unique, kGrainRows, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(dim);
    for (int64_t u = begin; u < end; ++u) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t p = first[u]; p < first[u + 1]; ++p) {
        const int64_t b = bag_of[p];
        const float* gb = g + b * dim;
        const float scale = bags.scale[b];
        for (int64_t d = 0; d < dim; ++d) acc[d] += gb[d] * scale;
      }
      const int64_t r = unique_rows[u];
      float* row = w + r * dim;
      if (kind == 0) {
        for (int64_t d = 0; d < dim; ++d) row[d] -= flr * acc[d];
      } else if (kind == 1) {
        float square = 0.0f;
        for (int64_t d = 0; d < dim; ++d) square += acc[d] * acc[d];
        state[r] += square / static_cast<float>(dim);
        const float rate = flr / (std::sqrt(state[r]) + feps);
        for (int64_t d = 0; d < dim; ++d) row[d] -= rate * acc[d];
      } else {
        float* mr = m + r * dim;
        float* vr = v + r * dim;
        for (int64_t d = 0; d < dim; ++d) {
          mr[d] = fb1 * mr[d] + (1.0f - fb1) * acc[d];
          vr[d] = fb2 * vr[d] + (1.0f - fb2) * acc[d] * acc[d];
          row[d] -= flr * (mr[d] / bias1) / (std::sqrt(vr[d] / bias2) + feps);
        }
      }
      slot[r] = -1;  // leave the scratch as we found it
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lookup", &lookup, "pooled lookup over a packed table");
  m.def("fused_update", &fused_update, "backward of lookup fused with a sparse optimizer step");
}
