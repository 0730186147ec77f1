// CPU kernels for packed embedding tables: pooled lookup, and the backward pass fused with
// a sparse optimizer step, each over one table or several that share rows, ids and offsets
// (Wide&Deep's deep and wide tables). The definition they implement is kernels/reference.py
// (one table alone: a call with one).
//
// Threads: ATen's parallel_for, i.e. torch's own OpenMP runtime and thread count, so the
// kernels never bring a second OpenMP runtime into the process.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

// A namespace of its own: picasso_kernels.cpp compiles the three sources as one unit.
namespace picasso_kernels::packed_embedding {

namespace {

constexpr int64_t kGrainBags = 1024;
constexpr int64_t kPrefetchDistance = 8;  // ids ahead: enough to hide a DRAM miss per row

// A table's dim, known at compile time for the common sizes (so the row loops unroll into
// SIMD) or at run time (kDim == 0) for any other.
template <int kDim>
struct Dim {
  int64_t runtime;
  inline int64_t value() const { return kDim ? kDim : runtime; }
};

template <typename F>
void with_dim(int64_t dim, F&& body) {
  switch (dim) {
    case 1: body(Dim<1>{dim}); break;
    case 4: body(Dim<4>{dim}); break;
    case 8: body(Dim<8>{dim}); break;
    case 16: body(Dim<16>{dim}); break;
    case 32: body(Dim<32>{dim}); break;
    case 64: body(Dim<64>{dim}); break;
    case 128: body(Dim<128>{dim}); break;
    default: body(Dim<0>{dim});
  }
}

// Bag b holds ids[start, stop): offsets[b] to the next bag's start (or the end of ids),
// cut to its field's max_len; a mean-pooled field scales the sum by 1 / length.
template <typename offset_t>
struct BagView {
  const offset_t* offsets;
  int64_t num_bags, num_ids, num_fields;
  const bool* mean;       // per field, or null: every field sums
  const int64_t* limit;   // per field, or null: no truncation

  inline int64_t start(int64_t b) const { return offsets[b]; }
  inline int64_t stop(int64_t b) const {
    int64_t end = b + 1 < num_bags ? static_cast<int64_t>(offsets[b + 1]) : num_ids;
    return limit ? std::min(end, start(b) + limit[b % num_fields]) : end;
  }
  inline float scale(int64_t b, int64_t length) const {
    return (mean && mean[b % num_fields] && length > 0) ? 1.0f / static_cast<float>(length) : 1.0f;
  }
};

template <typename F>
void with_bags(const torch::Tensor& offsets, int64_t num_ids, int64_t num_fields, const torch::Tensor& mean_pooled,
               const torch::Tensor& max_len, F&& body) {
  const bool* mean = mean_pooled.numel() ? mean_pooled.data_ptr<bool>() : nullptr;
  const int64_t* limit = max_len.numel() ? max_len.data_ptr<int64_t>() : nullptr;
  if (offsets.scalar_type() == torch::kInt32)
    body(BagView<int32_t>{offsets.data_ptr<int32_t>(), offsets.size(0), num_ids, num_fields, mean, limit});
  else
    body(BagView<int64_t>{offsets.data_ptr<int64_t>(), offsets.size(0), num_ids, num_fields, mean, limit});
}

// Pooled bags as (samples, fields, dim) with any sample stride: bag b (sample b / F, field
// b % F) at base + sample * stride + field * dim. A contiguous tensor has stride F * dim; a
// view of some columns of a model's flat input (samples, width) has the input's width, so a
// lookup writes straight into the dense part's input and its backward reads that input's
// gradient in place (no concatenation, no copy of each group's slice).
template <typename T>
struct BagRows {
  T* base;
  int64_t dim, num_fields, sample_stride;
  inline T* at(int64_t b) const { return base + (b / num_fields) * sample_stride + (b % num_fields) * dim; }
};

// Whether `t` is laid out as BagRows reads it: float32 (samples, fields, dim), each bag's
// row dense and the fields of a sample side by side.
bool bag_rows_layout(const torch::Tensor& t, const std::vector<int64_t>& shape) {
  return t.sizes() == shape && t.scalar_type() == torch::kFloat32 && t.stride(2) == 1 && t.stride(1) == shape[2] &&
         t.stride(0) >= shape[1] * shape[2];
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

namespace {

// Pool bags [begin, end) of one table into out.
template <typename DimT, typename BagsT>
void pool_bags(DimT dim_t, const BagsT& bags, const int64_t* id, const float* w, const BagRows<float>& o,
               int64_t begin, int64_t end) {
  const int64_t dim = dim_t.value(), num_ids = bags.num_ids;
  for (int64_t b = begin; b < end; ++b) {
    float* row_out = o.at(b);
    for (int64_t d = 0; d < dim; ++d) row_out[d] = 0.0f;
    const int64_t start = bags.start(b), stop = bags.stop(b);
    for (int64_t k = start; k < stop; ++k) {
      if (k + kPrefetchDistance < num_ids) __builtin_prefetch(w + id[k + kPrefetchDistance] * dim);
      const float* row = w + id[k] * dim;
      for (int64_t d = 0; d < dim; ++d) row_out[d] += row[d];
    }
    const float scale = bags.scale(b, stop - start);
    if (scale != 1.0f)
      for (int64_t d = 0; d < dim; ++d) row_out[d] *= scale;
  }
}

}  // namespace

// Several tables over the same rows, ids and offsets (Wide&Deep's deep and wide tables) in
// one call: a thread takes a run of bags and pools it from each table in turn, so the
// bags' ids and offsets are read from memory once, and the call pays one dispatch and one
// parallel region, not one per table.
std::vector<torch::Tensor> lookup_many(std::vector<torch::Tensor> weights, torch::Tensor ids, torch::Tensor offsets,
                                       int64_t num_fields, torch::Tensor mean_pooled, torch::Tensor max_len,
                                       std::vector<c10::optional<torch::Tensor>> into) {
  TORCH_CHECK(!weights.empty() && (into.empty() || into.size() == weights.size()),
              "lookup_many needs at least one table, and one output buffer (or None) per table or none");
  const int64_t num_bags = offsets.size(0), num_ids = ids.numel();
  std::vector<torch::Tensor> outs;
  for (size_t t = 0; t < weights.size(); ++t) {
    check_inputs(weights[t], ids, offsets, num_fields);
    const std::vector<int64_t> shape{num_bags / num_fields, num_fields, weights[t].size(1)};
    if (!into.empty() && into[t].has_value()) {
      TORCH_CHECK(bag_rows_layout(*into[t], shape),
                  "the output buffer must be a float32 (samples, fields, dim) tensor, contiguous but for its "
                  "sample stride");
      outs.push_back(*into[t]);
    } else {
      outs.push_back(torch::empty(shape, weights[t].options()));
    }
  }
  const int64_t* id = ids.data_ptr<int64_t>();
  with_bags(offsets, num_ids, num_fields, mean_pooled, max_len, [&](auto bags) {
    at::parallel_for(0, num_bags, kGrainBags, [&](int64_t begin, int64_t end) {
      for (size_t t = 0; t < weights.size(); ++t)
        with_dim(weights[t].size(1), [&](auto dim_t) {
          pool_bags(dim_t, bags, id, weights[t].data_ptr<float>(),
                    BagRows<float>{outs[t].data_ptr<float>(), weights[t].size(1), num_fields, outs[t].stride(0)},
                    begin, end);
        });
    });
  });
  return outs;
}

namespace {

struct Step {
  int kind;  // 0 sgd, 1 row-wise adagrad, 2 lazy adam, 3 element-wise adagrad
  float lr, eps, beta1, beta2, weight_decay, bias1, bias2;
  float* state;  // adagrad: one per row; element-wise adagrad: (rows, dim)
  float* m;      // adam: (rows, dim)
  float* v;
};

// g: the row's summed gradient, the caller's scratch, so L2 decay (g += wd * w, with w
// before the step) folds into it in place: no copy, and no pass at all when wd is 0.
template <typename DimT>
inline void apply_step(const Step& s, DimT dim_t, float* row, int64_t r, float* g) {
  const int64_t dim = dim_t.value();
  if (s.weight_decay != 0.0f)
    for (int64_t d = 0; d < dim; ++d) g[d] += s.weight_decay * row[d];
  if (s.kind == 0) {
    for (int64_t d = 0; d < dim; ++d) row[d] -= s.lr * g[d];
  } else if (s.kind == 1) {
    float square = 0.0f;
    for (int64_t d = 0; d < dim; ++d) square += g[d] * g[d];
    s.state[r] += square / static_cast<float>(dim);
    const float rate = s.lr / (std::sqrt(s.state[r]) + s.eps);
    for (int64_t d = 0; d < dim; ++d) row[d] -= rate * g[d];
  } else if (s.kind == 3) {
    float* sr = s.state + r * dim;
    for (int64_t d = 0; d < dim; ++d) {
      sr[d] += g[d] * g[d];
      row[d] -= s.lr * g[d] / (std::sqrt(sr[d]) + s.eps);
    }
  } else {
    float* mr = s.m + r * dim;
    float* vr = s.v + r * dim;
    for (int64_t d = 0; d < dim; ++d) {
      mr[d] = s.beta1 * mr[d] + (1.0f - s.beta1) * g[d];
      vr[d] = s.beta2 * vr[d] + (1.0f - s.beta2) * g[d] * g[d];
      row[d] -= s.lr * (mr[d] / s.bias1) / (std::sqrt(vr[d] / s.bias2) + s.eps);
    }
  }
}

}  // namespace

namespace {

// One table of a fused update: its rows, the gradient of its pooled output, its optimizer.
struct Table {
  float* w;
  BagRows<const float> g;  // the pooled bags' gradient
  int64_t dim;
  Step s;
};

Step make_step(const std::string& optimizer, const std::vector<double>& hyper, int64_t step,
               const std::vector<torch::Tensor>& slots) {
  TORCH_CHECK(optimizer == "sgd" || optimizer == "adagrad" || optimizer == "adam" || optimizer == "adagrad_elementwise",
              "unknown optimizer ", optimizer);
  TORCH_CHECK(hyper.size() == 5, "hyper-parameters: lr, eps, beta1, beta2, weight_decay");
  const int kind = optimizer == "sgd" ? 0 : optimizer == "adagrad" ? 1 : optimizer == "adam" ? 2 : 3;
  const double lr = hyper[0], eps = hyper[1], beta1 = hyper[2], beta2 = hyper[3], weight_decay = hyper[4];
  return Step{kind,
              static_cast<float>(lr),
              static_cast<float>(eps),
              static_cast<float>(beta1),
              static_cast<float>(beta2),
              static_cast<float>(weight_decay),
              kind == 2 ? static_cast<float>(1.0 - std::pow(beta1, step)) : 1.0f,
              kind == 2 ? static_cast<float>(1.0 - std::pow(beta2, step)) : 1.0f,
              kind == 1 || kind == 3 ? slots.at(0).data_ptr<float>() : nullptr,
              kind == 2 ? slots.at(0).data_ptr<float>() : nullptr,
              kind == 2 ? slots.at(1).data_ptr<float>() : nullptr};
}

// The occurrences of the rows one unit of work owns, in bag order: each one's entry in the
// unit's compact list of distinct rows, its bag, and the bag's pooling scale. Gathered once
// for every table, so the scratch map is searched once per id however many tables share
// the ids.
struct Occurrences {
  std::vector<int64_t> rows;  // distinct, in order of first occurrence
  std::vector<int32_t> slot;
  std::vector<int64_t> bag;
  std::vector<float> scale;
  std::vector<float> sums;  // one table's summed gradient of each row, reused table after table
};

// Gather the occurrences and sum the first table's gradient of each row (gradient g, the
// given dim) into `sums` in the same pass, the one pass a table alone needs; the occurrences
// themselves are kept only for other tables (`keep`). `slot_of(row)` is the row's entry in a
// -1 initialised scratch map, or null when another unit owns the row; the caller puts the
// entries of occ.rows back to -1.
template <typename DimT, typename BagsT, typename ForEachBag, typename SlotOf>
void gather_and_sum(DimT dim_t, const BagRows<const float>& g, const BagsT& bags, const int64_t* id, ForEachBag for_each_bag,
                    SlotOf slot_of, bool keep, Occurrences& occ, std::vector<float>& sums) {
  const int64_t dim = dim_t.value();
  occ.rows.clear();
  occ.slot.clear();
  occ.bag.clear();
  occ.scale.clear();
  sums.clear();
  for_each_bag([&](int64_t b) {
    const int64_t start = bags.start(b), stop = bags.stop(b);
    const float scale = bags.scale(b, stop - start);
    const float* gb = g.at(b);
    for (int64_t k = start; k < stop; ++k) {
      int32_t* at = slot_of(id[k]);
      if (!at) continue;
      if (*at < 0) {
        *at = static_cast<int32_t>(occ.rows.size());
        occ.rows.push_back(id[k]);
        sums.resize(sums.size() + dim, 0.0f);
      }
      float* sum = sums.data() + static_cast<int64_t>(*at) * dim;
      for (int64_t d = 0; d < dim; ++d) sum[d] += gb[d] * scale;
      if (keep) {
        occ.slot.push_back(*at);
        occ.bag.push_back(b);
        occ.scale.push_back(scale);
      }
    }
  });
}

// Another table's gradient of each gathered row, summed in the same (bag) order.
template <typename DimT>
void sum_gathered(DimT dim_t, const BagRows<const float>& g, const Occurrences& occ, std::vector<float>& sums) {
  const int64_t dim = dim_t.value();
  sums.assign(occ.rows.size() * dim, 0.0f);
  for (size_t i = 0; i < occ.slot.size(); ++i) {
    float* sum = sums.data() + static_cast<int64_t>(occ.slot[i]) * dim;
    const float* gb = g.at(occ.bag[i]);
    const float scale = occ.scale[i];
    for (int64_t d = 0; d < dim; ++d) sum[d] += gb[d] * scale;
  }
}

// Step each row once with its summed gradient (sums, in the order of rows).
template <typename DimT>
void step_rows(DimT dim_t, const Table& t, const std::vector<int64_t>& rows, std::vector<float>& sums) {
  const int64_t dim = dim_t.value();
  // Copies of our own: the compiler then knows no store to a row changes them, and keeps
  // the hyper-parameters in registers (through the caller's Table it could not: a float
  // store may alias a float member), which lets the row loops vectorise.
  const Step s = t.s;
  float* const w = t.w;
  for (size_t u = 0; u < rows.size(); ++u) {
    if (u + kPrefetchDistance < rows.size()) {
      const int64_t ahead = rows[u + kPrefetchDistance];
      __builtin_prefetch(w + ahead * dim, 1);
      // The row's optimizer state too: row-wise Adagrad's one float (a miss of its own in a
      // table of many rows), element-wise optimizers' row as wide as the row.
      if (s.kind == 1) __builtin_prefetch(s.state + ahead, 1);
      if (s.kind == 3) __builtin_prefetch(s.state + ahead * dim, 1);
      if (s.kind == 2) {
        __builtin_prefetch(s.m + ahead * dim, 1);
        __builtin_prefetch(s.v + ahead * dim, 1);
      }
    }
    apply_step(s, dim_t, w + rows[u] * dim, rows[u], sums.data() + static_cast<int64_t>(u) * dim);
  }
}

// One unit of work: gather its rows' occurrences, then sum and step every table.
template <typename BagsT, typename ForEachBag, typename SlotOf>
void update_unit(const std::vector<Table>& tables, const BagsT& bags, const int64_t* id, ForEachBag for_each_bag,
                 SlotOf slot_of, Occurrences& occ) {
  with_dim(tables[0].dim, [&](auto dim_t) {
    gather_and_sum(dim_t, tables[0].g, bags, id, for_each_bag, slot_of, tables.size() > 1, occ, occ.sums);
    step_rows(dim_t, tables[0], occ.rows, occ.sums);
  });
  for (size_t t = 1; t < tables.size(); ++t)
    with_dim(tables[t].dim, [&](auto dim_t) {
      sum_gathered(dim_t, tables[t].g, occ, occ.sums);
      step_rows(dim_t, tables[t], occ.rows, occ.sums);
    });
  for (int64_t r : occ.rows) *slot_of(r) = -1;
}

}  // namespace

// Backward of lookup_many fused with each table's optimizer: every touched row's gradient
// is summed over its occurrences and applied once; no (rows, dim) gradient is ever built.
// The tables share rows, ids and offsets (Wide&Deep's deep and wide tables), so the work is
// split, and the rows de-duplicated, once for all of them; each table keeps its own
// optimizer, hyper-parameters, slots and step. The summation order is the bag order
// whatever the thread count, so results do not depend on it, nor on which tables share a
// call: a table's result is exactly that of a call of its own.
//
// Work is split so that no two threads touch one row:
// - with `field_rows` (F + 1 row bounds: field f's ids lie in [field_rows[f],
//   field_rows[f + 1]), as in a PackedBatch), by field: a thread takes whole fields, and
//   its scratch and sums stay the size of one field's rows, a cache-sized working set;
// - with `disjoint_fields` (no id occurs in two fields, but fields have no row bounds: the
//   ids of a cache's fast tier), by field too, with `slot_of_row` as the scratch map;
// - otherwise, by the low bits of the row: each thread scans every bag and takes the rows
//   it owns, with `slot_of_row` (caller-owned, one int32 per table row, all -1 between
//   calls) as the scratch map.
void fused_update_many(std::vector<torch::Tensor> weights, std::vector<std::vector<torch::Tensor>> slots,
                       torch::Tensor ids, torch::Tensor offsets, std::vector<torch::Tensor> grads, int64_t num_fields,
                       std::vector<std::string> optimizers, std::vector<std::vector<double>> hyper,
                       std::vector<int64_t> steps, torch::Tensor mean_pooled, torch::Tensor max_len,
                       torch::Tensor field_rows, torch::Tensor slot_of_row, bool disjoint_fields) {
  const size_t count = weights.size();
  TORCH_CHECK(count > 0 && slots.size() == count && grads.size() == count && optimizers.size() == count &&
                  hyper.size() == count && steps.size() == count,
              "fused_update_many needs, per table, its slots, gradient, optimizer, hyper-parameters and step");
  const int64_t num_bags = offsets.size(0), num_ids = ids.numel();
  std::vector<Table> tables;
  for (size_t t = 0; t < count; ++t) {
    check_inputs(weights[t], ids, offsets, num_fields);
    TORCH_CHECK(weights[t].size(0) == weights[0].size(0), "the tables of one call must have the same rows");
    const int64_t dim = weights[t].size(1);
    TORCH_CHECK(bag_rows_layout(grads[t], {num_bags / num_fields, num_fields, dim}),
                "grad must be a float32 (samples, fields, dim) tensor, contiguous but for its sample stride");
    tables.push_back(Table{weights[t].data_ptr<float>(),
                           BagRows<const float>{grads[t].data_ptr<float>(), dim, num_fields, grads[t].stride(0)}, dim,
                           make_step(optimizers[t], hyper[t], steps[t], slots[t])});
  }
  const int64_t num_samples = num_bags / num_fields;
  const int64_t* id = ids.data_ptr<int64_t>();

  with_bags(offsets, num_ids, num_fields, mean_pooled, max_len, [&](auto bags) {
    // A thread takes whole fields; `slot_of(f, local)` is field f's scratch map (local:
    // the thread's own scratch of `local_size` entries).
    auto step_by_field = [&](int64_t local_size, auto&& slot_of) {
      at::parallel_for(0, num_fields, 1, [&](int64_t first, int64_t last) {
        std::vector<int32_t> local(local_size, -1);
        Occurrences occ;
        for (int64_t f = first; f < last; ++f)
          update_unit(
              tables, bags, id,
              [&](auto&& visit) {
                for (int64_t i = 0; i < num_samples; ++i) visit(i * num_fields + f);
              },
              slot_of(f, local), occ);
      });
    };
    if (field_rows.numel()) {
      TORCH_CHECK(field_rows.numel() == num_fields + 1 && field_rows.scalar_type() == torch::kInt64,
                  "field_rows must hold num_fields + 1 int64 row bounds");
      const int64_t* bound = field_rows.data_ptr<int64_t>();
      int64_t widest = 0;
      for (int64_t f = 0; f < num_fields; ++f) widest = std::max(widest, bound[f + 1] - bound[f]);
      // Checked before anything moves: an id outside its field's rows would race.
      std::atomic<bool> outside{false};
      at::parallel_for(0, num_fields, 1, [&](int64_t first, int64_t last) {
        for (int64_t f = first; f < last; ++f)
          for (int64_t i = 0; i < num_samples; ++i) {
            const int64_t b = i * num_fields + f;
            for (int64_t k = bags.start(b); k < bags.stop(b); ++k)
              if (id[k] < bound[f] || id[k] >= bound[f + 1]) outside = true;
          }
      });
      TORCH_CHECK(!outside, "an id lies outside its field's rows (field_rows)");
      step_by_field(widest, [&](int64_t f, std::vector<int32_t>& local) {
        const int64_t base = bound[f];
        return [&local, base](int64_t r) { return &local[r - base]; };
      });
      return;
    }
    TORCH_CHECK(slot_of_row.numel() >= weights[0].size(0) && slot_of_row.scalar_type() == torch::kInt32,
                "slot_of_row must be int32 scratch with one entry per row");
    int32_t* slot = slot_of_row.data_ptr<int32_t>();
    if (disjoint_fields) {
      step_by_field(0, [&](int64_t, std::vector<int32_t>&) { return [slot](int64_t r) { return slot + r; }; });
      return;
    }
    // A power of two of owners, at least one per thread: the owner test is a mask.
    int64_t owners = 1;
    while (owners < at::get_num_threads()) owners *= 2;
    const int64_t mask = owners - 1;
    at::parallel_for(0, owners, 1, [&](int64_t first, int64_t last) {
      Occurrences occ;
      for (int64_t owner = first; owner < last; ++owner)
        update_unit(
            tables, bags, id,
            [&](auto&& visit) {
              for (int64_t b = 0; b < num_bags; ++b) visit(b);
            },
            [&](int64_t r) { return (r & mask) == owner ? slot + r : nullptr; }, occ);
    });
  });
}

// The kernels release the GIL: a step computing in one thread and the next batch being
// prepared in another then run side by side.
void register_ops(py::module_ m) {
  m.def("lookup_many", &lookup_many, "pooled lookups over packed tables that share rows, ids and offsets",
        py::call_guard<py::gil_scoped_release>());
  m.def("fused_update_many", &fused_update_many,
        "backward of lookup_many fused with each table's sparse optimizer step",
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace picasso_kernels::packed_embedding
