// CPU kernels for the hot-row cache's per-batch bookkeeping. The definition they implement
// is kernels/reference.py (map_to_slots, sketch_add).
//
// Both are single passes over one batch's ids, one thread: a batch holds tens of
// thousands of ids, where the sort behind torch.unique and a dozen small tensor ops
// (each waking the thread pool) cost more than the work itself.

#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

// A namespace of its own: picasso_kernels.cpp compiles the three sources as one unit.
namespace picasso_kernels::hot_cache {

namespace {

constexpr int64_t kPrefetchDistance = 8;  // ids ahead: enough to hide a DRAM miss per row

// De-duplicate ids in order of first occurrence and map each to its fast-tier index: a hot
// row's slot, or capacity + its position among the batch's misses. `mark` is one int32
// per table row, all -1 on entry and on return. Returns local ids, then the misses (rows
// and lookup counts) and the hits (slots and lookup counts), each in first-seen order.
std::vector<torch::Tensor> map_to_slots(torch::Tensor ids, torch::Tensor slot_of_row, int64_t capacity,
                                        torch::Tensor mark) {
  TORCH_CHECK(ids.scalar_type() == torch::kInt64 && ids.is_contiguous(), "ids must be contiguous int64");
  TORCH_CHECK(slot_of_row.scalar_type() == torch::kInt32 && slot_of_row.is_contiguous(),
              "slot_of_row must be contiguous int32");
  TORCH_CHECK(mark.scalar_type() == torch::kInt32 && mark.numel() == slot_of_row.numel(),
              "mark must be int32 scratch with one entry per row");
  const int64_t n = ids.numel();
  const int64_t rows_in_table = slot_of_row.numel();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int32_t* slot_of = slot_of_row.data_ptr<int32_t>();
  int32_t* seen = mark.data_ptr<int32_t>();  // row -> its entry: 2u for the u-th miss, 2u+1 for the u-th hit

  if (n) {
    const auto [lowest, highest] = std::minmax_element(id, id + n);
    TORCH_CHECK(*lowest >= 0 && *highest < rows_in_table, "id ", *lowest < 0 ? *lowest : *highest,
                " lies outside the table's ", rows_in_table, " rows");
  }
  auto local = torch::empty({n}, ids.options());
  int64_t* local_ptr = local.data_ptr<int64_t>();
  std::vector<int64_t> miss_rows, miss_counts, hit_slots, hit_counts, touched;
  for (auto* v : {&miss_rows, &miss_counts, &hit_slots, &hit_counts, &touched}) v->reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    // Ids are scattered over tables of millions of rows: fetch the two entries an id a few
    // places ahead will read, so their DRAM misses overlap this one's work.
    if (i + kPrefetchDistance < n) {
      __builtin_prefetch(seen + id[i + kPrefetchDistance]);
      __builtin_prefetch(slot_of + id[i + kPrefetchDistance]);
    }
    const int64_t row = id[i];
    int32_t entry = seen[row];
    if (entry < 0) {
      touched.push_back(row);
      const int32_t slot = slot_of[row];
      if (slot >= 0) {
        entry = static_cast<int32_t>(2 * hit_slots.size() + 1);
        hit_slots.push_back(slot);
        hit_counts.push_back(0);
      } else {
        entry = static_cast<int32_t>(2 * miss_rows.size());
        miss_rows.push_back(row);
        miss_counts.push_back(0);
      }
      seen[row] = entry;
    }
    const int64_t u = entry >> 1;
    if (entry & 1) {
      hit_counts[u] += 1;
      local_ptr[i] = hit_slots[u];
    } else {
      miss_counts[u] += 1;
      local_ptr[i] = capacity + u;
    }
  }
  for (int64_t row : touched) seen[row] = -1;
  auto as_tensor = [&](const std::vector<int64_t>& values) {
    return torch::from_blob(const_cast<int64_t*>(values.data()), {static_cast<int64_t>(values.size())},
                            ids.options())
        .clone();
  };
  return {local, as_tensor(miss_rows), as_tensor(miss_counts), as_tensor(hit_slots), as_tensor(hit_counts)};
}

// Positions i where rows[i] is one of `among`; `mark` is one int32 per table row, all -1
// on entry and on return.
torch::Tensor positions_in(torch::Tensor rows, torch::Tensor among, torch::Tensor mark) {
  TORCH_CHECK(rows.scalar_type() == torch::kInt64 && among.scalar_type() == torch::kInt64 && rows.is_contiguous() &&
                  among.is_contiguous(),
              "positions_in: contiguous int64 rows");
  TORCH_CHECK(mark.scalar_type() == torch::kInt32, "positions_in: int32 scratch");
  int32_t* flag = mark.data_ptr<int32_t>();
  const int64_t size = mark.numel();
  const int64_t* a = among.data_ptr<int64_t>();
  const int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t j = 0; j < among.numel(); ++j) {
    TORCH_CHECK(a[j] >= 0 && a[j] < size, "positions_in: row ", a[j], " outside the table");
    flag[a[j]] = 0;
  }
  std::vector<int64_t> found;
  for (int64_t i = 0; i < rows.numel(); ++i) {
    TORCH_CHECK(r[i] >= 0 && r[i] < size, "positions_in: row ", r[i], " outside the table");
    if (flag[r[i]] == 0) found.push_back(i);
  }
  for (int64_t j = 0; j < among.numel(); ++j) flag[a[j]] = -1;
  return torch::from_blob(found.data(), {static_cast<int64_t>(found.size())}, rows.options()).clone();
}

// dst[dst_index[i]] = src[src_index[i]] for every i, row by row (an empty index means
// 0, 1, 2, ...). Moves between the tiers are a few thousand short rows: one thread and a
// memcpy each beat waking the thread pool.
void copy_rows(torch::Tensor dst, torch::Tensor dst_index, torch::Tensor src, torch::Tensor src_index) {
  TORCH_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.scalar_type() == src.scalar_type(),
              "copy_rows: contiguous tensors of one dtype");
  TORCH_CHECK(dst.device().is_cpu() && src.device().is_cpu(), "copy_rows: host tensors");
  auto row_width = [](const torch::Tensor& t) {
    int64_t width = 1;
    for (int64_t d = 1; d < t.dim(); ++d) width *= t.size(d);
    return width;
  };
  const int64_t width = row_width(dst), src_width = row_width(src);
  TORCH_CHECK(width == src_width, "copy_rows: rows of ", width, " and ", src_width, " values");
  const int64_t count = dst_index.numel() ? dst_index.numel() : src_index.numel();
  TORCH_CHECK(!dst_index.numel() || !src_index.numel() || dst_index.numel() == src_index.numel(),
              "copy_rows: indices of different lengths");
  const int64_t* di = dst_index.numel() ? dst_index.data_ptr<int64_t>() : nullptr;
  const int64_t* si = src_index.numel() ? src_index.data_ptr<int64_t>() : nullptr;
  const int64_t dst_rows = dst.dim() ? dst.size(0) : 0, src_rows = src.dim() ? src.size(0) : 0;
  const int64_t bytes = width * dst.element_size();
  char* out = static_cast<char*>(dst.data_ptr());
  const char* in = static_cast<const char*>(src.data_ptr());
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchDistance < count) {  // scattered rows: overlap their DRAM misses
      const int64_t ahead = i + kPrefetchDistance;
      if (si && si[ahead] >= 0 && si[ahead] < src_rows) __builtin_prefetch(in + si[ahead] * bytes);
      if (di && di[ahead] >= 0 && di[ahead] < dst_rows) __builtin_prefetch(out + di[ahead] * bytes, 1);
    }
    const int64_t d = di ? di[i] : i, s = si ? si[i] : i;
    TORCH_CHECK(d >= 0 && d < dst_rows && s >= 0 && s < src_rows, "copy_rows: row index out of range");
    std::memcpy(out + d * bytes, in + s * bytes, bytes);
  }
}

// Conservative count-min update: every row's estimate (the least of its `depth` counters)
// rises by its count, and each counter rises to at most the largest new estimate among
// the rows that hash to it. All estimates are read before any counter moves. Returns the
// new estimates. Hashing: multiply-shift over a premixed id, as reference.py.
torch::Tensor sketch_add(torch::Tensor counters, torch::Tensor rows, torch::Tensor counts, torch::Tensor multipliers,
                         int64_t bits) {
  TORCH_CHECK(counters.scalar_type() == torch::kFloat32 && counters.is_contiguous(), "counters must be float32");
  TORCH_CHECK(rows.scalar_type() == torch::kInt64 && counts.scalar_type() == torch::kInt64,
              "rows and counts must be int64");
  TORCH_CHECK(multipliers.scalar_type() == torch::kInt64, "multipliers must be int64");
  const int64_t depth = multipliers.numel();
  const int64_t width = int64_t{1} << bits;
  TORCH_CHECK(counters.numel() == depth * width, "counters must hold depth x 2^bits values");
  rows = rows.contiguous();
  counts = counts.contiguous();
  multipliers = multipliers.contiguous();
  const int64_t n = rows.numel();
  const int64_t* row = rows.data_ptr<int64_t>();
  const int64_t* count = counts.data_ptr<int64_t>();
  const int64_t* multiplier = multipliers.data_ptr<int64_t>();
  float* counter = counters.data_ptr<float>();

  // The cells first (arithmetic only), so that the passes over the counters, which are
  // scattered over tens of MB, can fetch a few rows ahead.
  std::vector<int64_t> cells(n * depth);
  const uint64_t golden = 0x9E3779B97F4A7C15ULL;
  for (int64_t i = 0; i < n; ++i) {
    // Two's-complement wrapping, as torch's int64 ops; >> on int64 is arithmetic there too.
    int64_t mixed = static_cast<int64_t>(static_cast<uint64_t>(row[i]) * golden);
    mixed = mixed ^ (mixed >> 29);
    for (int64_t d = 0; d < depth; ++d) {
      const int64_t hashed = static_cast<int64_t>(static_cast<uint64_t>(mixed) * static_cast<uint64_t>(multiplier[d]))
                             >> (64 - bits);
      cells[i * depth + d] = (hashed & (width - 1)) + d * width;
    }
  }
  auto prefetch_row = [&](int64_t i) {
    if (i < n)
      for (int64_t d = 0; d < depth; ++d) __builtin_prefetch(counter + cells[i * depth + d], 1);
  };
  auto raised = torch::empty({n}, counters.options());
  float* raised_ptr = raised.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    prefetch_row(i + kPrefetchDistance);
    float least = std::numeric_limits<float>::infinity();
    for (int64_t d = 0; d < depth; ++d) least = std::min(least, counter[cells[i * depth + d]]);
    raised_ptr[i] = least + static_cast<float>(count[i]);
  }
  for (int64_t i = 0; i < n; ++i) {
    prefetch_row(i + kPrefetchDistance);
    for (int64_t d = 0; d < depth; ++d) {
      float& c = counter[cells[i * depth + d]];
      c = std::max(c, raised_ptr[i]);
    }
  }
  return raised;
}

}  // namespace

// The kernels release the GIL: a step computing in one thread and the next batch being
// prepared in another then run side by side.
void register_ops(py::module_ m) {
  m.def("map_to_slots", &map_to_slots, "de-duplicate a batch's ids and map them to fast-tier indices",
        py::call_guard<py::gil_scoped_release>());
  m.def("positions_in", &positions_in, "positions of the rows that are among others",
        py::call_guard<py::gil_scoped_release>());
  m.def("copy_rows", &copy_rows, "copy rows between tensors by index, one thread",
        py::call_guard<py::gil_scoped_release>());
  m.def("sketch_add", &sketch_add, "conservative count-min sketch update",
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace picasso_kernels::hot_cache
