// One packing group of a batch packed in one call: every field's ids, each shifted by the
// field's id offset, laid out sample-major (sample after sample, within a sample field
// after field), and the int32 start of every (sample, field) bag. The definition is
// kernels/pack_groups_reference.py (the contract: kernels/group_ids.py), held to it bit for
// bit; picasso/batch.py turns the result into the PackedBatch's Arrow columns.
//
// It reads the Arrow buffers in place: each field comes as a row of `fields`, the
// addresses and element offsets of its list offsets and its int64 values
// (kernels/pack_groups_cpu.py reads them off the arrays, which the caller keeps alive for
// the call). At hundreds of fields the per-field Python and numpy calls of the reference
// cost more than moving the ids.
//
// The samples go in blocks, each block's ids written from a start fixed beforehand (the
// ids of the blocks before it), so blocks spread over torch's threads (ATen's parallel_for)
// without waiting on each other, and the result does not depend on the thread count.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

// A namespace of its own: picasso_kernels.cpp compiles the sources as one unit.
namespace picasso_kernels::pack_groups {

namespace {

// The columns of a row of `fields`, as pack_groups_cpu.FIELD_COLUMNS writes them.
enum Field : int64_t {
  kOffsets,      // the list array's offsets buffer
  kLargeOffsets, // 1: int64 offsets (large_list); 0: int32 (list)
  kOffsetStart,  // the list array's element offset (a sliced array's)
  kValues,       // the child array's int64 values buffer
  kValueStart,   // the child array's element offset
  kIdOffset,     // added to each of the field's ids
  kFieldColumns,
};

// Ids per thread at least: copying an id costs a nanosecond or two, and on a busy
// two-core machine a second thread can wait a time slice to be scheduled while the first
// spins: a batch of 1,024 samples of 194 one-hot fields took 7.7 ms on two threads, 0.3 ms
// on one. Only groups of millions of ids spread.
constexpr int64_t kGrainIds = int64_t(1) << 20;
// Samples per block: a block's bag starts (samples x fields int32) stay in the L2 cache
// between the passes over it, at hundreds of fields.
constexpr int64_t kBlockSamples = 64;
// Samples per tile of the one-hot case: a tile's ids (tile x fields int64) stay in the L1
// cache while the fields' values are written across them.
constexpr int64_t kTileSamples = 16;

struct FieldColumn {
  const void* offsets;
  bool large;
  int64_t offset_start;
  const int64_t* values;  // the child array's first element
  int64_t id_offset;

  explicit FieldColumn(const int64_t* row)
      : offsets(reinterpret_cast<const void*>(row[kOffsets])),
        large(row[kLargeOffsets] != 0),
        offset_start(row[kOffsetStart]),
        values(reinterpret_cast<const int64_t*>(row[kValues]) + row[kValueStart]),
        id_offset(row[kIdOffset]) {}

  // fn(offsets) with the field's offsets as their own type, from the array's first row:
  // the loops over a field's rows are then compiled once per offset width, not branched
  // per row.
  template <typename Fn>
  auto visit(Fn&& fn) const {
    if (large) return fn(static_cast<const int64_t*>(offsets) + offset_start);
    return fn(static_cast<const int32_t*>(offsets) + offset_start);
  }
};

bool one_hot(const FieldColumn& field, int64_t n) {
  return field.visit([n](const auto* o) {
    for (int64_t i = 0; i < n; ++i)
      if (o[i + 1] - o[i] != 1) return false;
    return true;
  });
}

// Every bag one id: ids[i * F + f] is field f's id of sample i, and bag k starts at k.
void pack_one_hot(const std::vector<FieldColumn>& fields, int64_t n, int64_t* ids, int32_t* starts) {
  const int64_t count = static_cast<int64_t>(fields.size());
  const int64_t blocks = (n + kBlockSamples - 1) / kBlockSamples;
  const int64_t grain = std::max<int64_t>(1, kGrainIds / (kBlockSamples * count));
  // Each field's values from its first row's on (a one-hot field's row i is value i).
  std::vector<const int64_t*> first_values(count);
  for (int64_t f = 0; f < count; ++f)
    first_values[f] = fields[f].values + fields[f].visit([](const auto* o) { return static_cast<int64_t>(o[0]); });
  at::parallel_for(0, blocks, grain, [&](int64_t first, int64_t last) {
    const int64_t begin = first * kBlockSamples, end = std::min(n, last * kBlockSamples);
    for (int64_t tile = begin; tile < end; tile += kTileSamples) {
      const int64_t tile_end = std::min(end, tile + kTileSamples);
      for (int64_t f = 0; f < count; ++f) {
        const int64_t* v = first_values[f];
        const int64_t id_offset = fields[f].id_offset;
        for (int64_t i = tile; i < tile_end; ++i) ids[i * count + f] = v[i] + id_offset;
      }
    }
    for (int64_t k = begin * count; k < end * count; ++k) starts[k] = static_cast<int32_t>(k);
    if (end == n) starts[n * count] = static_cast<int32_t>(n * count);
  });
}

// Any bags: per block of samples, each bag's length at its start's place, then the block's
// running sum from its first id, then each bag's ids copied to its start.
torch::Tensor pack_bags(const std::vector<FieldColumn>& fields, const std::vector<char>& one_hots, int64_t n,
                        int32_t* starts, const torch::TensorOptions& options) {
  const int64_t count = static_cast<int64_t>(fields.size());
  const int64_t blocks = (n + kBlockSamples - 1) / kBlockSamples;
  std::vector<int64_t> block_start(blocks + 1, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlockSamples, end = std::min(n, begin + kBlockSamples);
    int64_t values = 0;
    for (const FieldColumn& field : fields)
      values += field.visit([&](const auto* o) { return static_cast<int64_t>(o[end] - o[begin]); });
    block_start[b + 1] = block_start[b] + values;
  }
  const int64_t total = block_start[blocks];
  TORCH_CHECK(total <= std::numeric_limits<int32_t>::max(), "a group of ", total,
              " ids overflows its int32 bag offsets");
  auto ids_tensor = torch::empty({total}, options);
  int64_t* ids = ids_tensor.data_ptr<int64_t>();
  starts[0] = 0;
  const int64_t grain = std::max<int64_t>(1, kGrainIds * blocks / std::max<int64_t>(1, total));
  at::parallel_for(0, blocks, grain, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t begin = b * kBlockSamples, end = std::min(n, begin + kBlockSamples);
      // starts[k + 1] is bag k's end: its length first, then the running sum.
      for (int64_t f = 0; f < count; ++f) {
        fields[f].visit([&](const auto* o) {
          for (int64_t i = begin; i < end; ++i) starts[i * count + f + 1] = static_cast<int32_t>(o[i + 1] - o[i]);
        });
      }
      int32_t running = static_cast<int32_t>(block_start[b]);
      for (int64_t k = begin * count; k < end * count; ++k) starts[k + 1] = running += starts[k + 1];
      // Each bag's start: the block's first, or the end of the bag before it.
      for (int64_t f = 0; f < count; ++f) {
        const FieldColumn& field = fields[f];
        field.visit([&](const auto* o) {
          const int64_t block_first = begin * count;
          if (one_hots[f]) {  // the usual field beside a multi-hot one: no loop per bag
            const int64_t* v = field.values + o[0];
            for (int64_t i = begin; i < end; ++i) {
              const int64_t k = i * count + f;
              ids[k == block_first ? block_start[b] : starts[k]] = v[i] + field.id_offset;
            }
            return;
          }
          for (int64_t i = begin; i < end; ++i) {
            const int64_t k = i * count + f;
            const int64_t at = k == block_first ? block_start[b] : starts[k];
            const int64_t* v = field.values + o[i];
            const int64_t length = static_cast<int64_t>(o[i + 1] - o[i]);
            for (int64_t j = 0; j < length; ++j) ids[at + j] = v[j] + field.id_offset;
          }
        });
      }
    }
  });
  return ids_tensor;
}

// (ids int64, bag starts int32 (n * fields + 1,)): see group_ids.GroupIds.
std::vector<torch::Tensor> pack(torch::Tensor fields_table, int64_t n) {
  TORCH_CHECK(fields_table.scalar_type() == torch::kInt64 && fields_table.is_contiguous() &&
                  fields_table.dim() == 2 && fields_table.size(1) == kFieldColumns && fields_table.size(0) > 0,
              "fields must be contiguous int64 (fields > 0, ", int64_t(kFieldColumns), ")");
  TORCH_CHECK(n >= 0, "rows must not be negative");
  const int64_t count = fields_table.size(0);
  TORCH_CHECK(n * count < std::numeric_limits<int32_t>::max(), "a group of ", n * count,
              " bags overflows its int32 bag offsets");
  const int64_t* rows = fields_table.data_ptr<int64_t>();
  std::vector<FieldColumn> fields;
  fields.reserve(count);
  for (int64_t f = 0; f < count; ++f) fields.emplace_back(rows + f * kFieldColumns);
  const auto options = fields_table.options();
  auto starts = torch::empty({n * count + 1}, options.dtype(torch::kInt32));
  int32_t* start = starts.data_ptr<int32_t>();
  std::vector<char> one_hots(count);
  for (int64_t f = 0; f < count; ++f) one_hots[f] = one_hot(fields[f], n);
  // The reference's test: no rows is not one-hot (its ids are none, its one start 0).
  const bool all_one_hot = n > 0 && std::all_of(one_hots.begin(), one_hots.end(), [](char o) { return o != 0; });
  if (all_one_hot) {
    auto ids = torch::empty({n * count}, options);
    pack_one_hot(fields, n, ids.data_ptr<int64_t>(), start);
    return {ids, starts};
  }
  return {pack_bags(fields, one_hots, n, start, options), starts};
}

}  // namespace

// The kernel releases the GIL: a batch packing in one thread and a step computing in
// another then run side by side.
void register_ops(py::module_ m) {
  m.def("pack", &pack, "one packing group's ids and bag starts from its fields' Arrow buffers",
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace picasso_kernels::pack_groups
