// The feature crosses of one batch in one call: each cross's bag per row, every
// combination of one key per field (the first field outermost, the last fastest) cut to
// the cross's max_len, each hashed as picasso/hashing.py's cross, bit for bit. The
// definition is kernels/cross_ids_reference.py (the contract: kernels/id_columns.py).
//
// It reads the fields' keys as decode_ids gives them (decoded columns: ids, each column's
// int32 bag offsets from its start), and gives the crosses the same way. A row's
// combinations go as an odometer over its fields' bags, keeping the hash of each prefix
// of fields, so that turning the last field's wheel costs one mix, not one per field.
//
// One thread: a batch has a few crosses of a few ids a row, tens of microseconds of
// hashing at 1,024 rows, less than waking a second thread costs on a busy machine
// (pack_groups.cpp's measurements). Each cross's room is its exact number of ids, known
// after a first pass over the bag lengths.

#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "hashing.h"  // splitmix64, FastMod

// A namespace of its own: picasso_kernels.cpp compiles the sources as one unit.
namespace picasso_kernels::cross_ids {

namespace {

// The columns of a row of `rules`, as id_columns.CROSS_FIELDS.
enum Rule : int64_t {
  kKind,     // kBucket, kKey
  kModulus,  // kBucket: hash buckets
  kMaxLen,
  kStart,    // hashing.cross_start: where the hash of a combination starts
  kFirst,    // the cross's first field's decoded column
  kCount,    // its fields, in consecutive columns from kFirst
  kRuleFields,
};
enum Kind : int64_t { kBucket, kKey };  // id_columns' BUCKET and KEY

// The decoded columns of the fields' keys.
struct Columns {
  const int64_t* ids;
  const int32_t* offsets;  // (columns, n + 1)
  const int64_t* starts;
  int64_t n;

  // Row i's keys in column c, and how many.
  const int64_t* keys(int64_t c, int64_t i) const { return ids + starts[c] + offsets[c * (n + 1) + i]; }
  int64_t length(int64_t c, int64_t i) const {
    return int64_t(offsets[c * (n + 1) + i + 1]) - offsets[c * (n + 1) + i];
  }
};

// A column's bags must lie in ids, from 0 up: the op reads them unchecked afterwards.
void check_column(const Columns& columns, int64_t c, int64_t total_ids) {
  const int32_t* o = columns.offsets + c * (columns.n + 1);
  TORCH_CHECK(columns.starts[c] >= 0 && o[0] >= 0, "cross_ids: column ", c, " starts before its ids");
  for (int64_t i = 0; i < columns.n; ++i)
    TORCH_CHECK(o[i + 1] >= o[i], "cross_ids: column ", c, "'s offsets go down at row ", i);
  TORCH_CHECK(columns.starts[c] + o[columns.n] <= total_ids, "cross_ids: column ", c, " runs past the ", total_ids,
              " ids");
}

// Row i's number of crosses: the product of its fields' bag lengths, cut to max_len. Cut
// as it goes (the reference's order), so that no product of long bags overflows.
int64_t combinations(const Columns& columns, const int64_t* rule, int64_t i) {
  const int64_t max_len = rule[kMaxLen];
  int64_t count = 1;
  for (int64_t c = rule[kFirst]; c < rule[kFirst] + rule[kCount]; ++c) {
    const unsigned __int128 product = static_cast<unsigned __int128>(count) * columns.length(c, i);
    count = product < static_cast<unsigned __int128>(max_len) ? static_cast<int64_t>(product) : max_len;
  }
  return count;
}

// Row i's `count` crosses, into out. keys, at, prefix: scratch of the cross's fields.
void cross_row(const Columns& columns, const int64_t* rule, const FastMod& buckets, int64_t i, int64_t count,
               int64_t* out, std::vector<const int64_t*>& keys, std::vector<int64_t>& at,
               std::vector<uint64_t>& prefix) {
  const int64_t fields = rule[kCount];
  // prefix[k]: the hash after the first k fields' keys at positions at[0..k).
  prefix[0] = static_cast<uint64_t>(rule[kStart]);
  for (int64_t k = 0; k < fields; ++k) {
    keys[k] = columns.keys(rule[kFirst] + k, i);
    at[k] = 0;
    prefix[k + 1] = splitmix64(prefix[k] ^ static_cast<uint64_t>(keys[k][0]));
  }
  for (int64_t p = 0;;) {
    const uint64_t h = prefix[fields];
    out[p] = rule[kKind] == kBucket ? static_cast<int64_t>(buckets(h)) : static_cast<int64_t>(h);
    if (++p == count) return;
    // The next combination: the last wheel that can turn turns, those after it go back to
    // their first key; the prefixes from it on are hashed again.
    int64_t k = fields - 1;
    while (++at[k] == columns.length(rule[kFirst] + k, i)) at[k--] = 0;
    for (; k < fields; ++k) prefix[k + 1] = splitmix64(prefix[k] ^ static_cast<uint64_t>(keys[k][at[k]]));
  }
}

// Whether every row has one key in each of the cross's fields: the usual cross, of
// one-hot fields, whose rows cross_each hashes.
bool one_each(const Columns& columns, const int64_t* rule) {
  if (rule[kMaxLen] < 1) return false;
  for (int64_t c = rule[kFirst]; c < rule[kFirst] + rule[kCount]; ++c) {
    const int32_t* o = columns.offsets + c * (columns.n + 1);
    bool ones = true;
    for (int64_t i = 0; i < columns.n; ++i) ones &= o[i + 1] - o[i] == 1;  // no branch: it vectorises
    if (!ones) return false;
  }
  return true;
}

// A cross of one key per field in every row: row i's one cross into out[i], in a loop
// whose rows do not wait on each other, so that the CPU overlaps their chains of mixes
// (three crosses of 1,024 rows: 25 us a call, 40 us by cross_row's odometer).
void cross_each(const Columns& columns, const int64_t* rule, const FastMod& buckets, int64_t* out,
                std::vector<const int64_t*>& keys) {
  const int64_t fields = rule[kCount];
  for (int64_t k = 0; k < fields; ++k) keys[k] = columns.keys(rule[kFirst] + k, 0);
  const uint64_t start = static_cast<uint64_t>(rule[kStart]);
  const bool bucket = rule[kKind] == kBucket;
  for (int64_t i = 0; i < columns.n; ++i) {
    uint64_t h = start;
    for (int64_t k = 0; k < fields; ++k) h = splitmix64(h ^ static_cast<uint64_t>(keys[k][i]));
    out[i] = bucket ? static_cast<int64_t>(buckets(h)) : static_cast<int64_t>(h);
  }
}

// (ids, offsets (X, n + 1) int32, starts (X,)): the crosses as id_columns.DecodedIds.
std::vector<torch::Tensor> cross(torch::Tensor ids, torch::Tensor offsets, torch::Tensor starts, torch::Tensor rules,
                                 int64_t n) {
  TORCH_CHECK(n >= 0, "cross_ids: rows must not be negative");
  TORCH_CHECK(ids.scalar_type() == torch::kInt64 && ids.is_contiguous() && ids.dim() == 1,
              "cross_ids: ids must be contiguous 1-d int64");
  TORCH_CHECK(offsets.scalar_type() == torch::kInt32 && offsets.is_contiguous() && offsets.dim() == 2 &&
                  offsets.size(1) == n + 1,
              "cross_ids: offsets must be contiguous int32 (columns, ", n + 1, ")");
  const int64_t column_count = offsets.size(0);
  TORCH_CHECK(starts.scalar_type() == torch::kInt64 && starts.is_contiguous() && starts.dim() == 1 &&
                  starts.size(0) == column_count,
              "cross_ids: starts must be contiguous int64 (", column_count, ",)");
  TORCH_CHECK(rules.scalar_type() == torch::kInt64 && rules.is_contiguous() && rules.dim() == 2 &&
                  rules.size(1) == kRuleFields,
              "cross_ids: rules must be contiguous int64 (crosses, ", int64_t(kRuleFields), ")");
  const Columns columns{ids.data_ptr<int64_t>(), offsets.data_ptr<int32_t>(), starts.data_ptr<int64_t>(), n};
  const int64_t cross_count = rules.size(0);
  const int64_t* rule_rows = rules.data_ptr<int64_t>();
  std::vector<char> checked(column_count, 0);
  int64_t widest = 0;
  for (int64_t x = 0; x < cross_count; ++x) {
    const int64_t* rule = rule_rows + x * kRuleFields;
    TORCH_CHECK(rule[kKind] == kKey || (rule[kKind] == kBucket && rule[kModulus] > 0), "cross_ids: cross ", x,
                " is neither a key cross nor a bucket cross of buckets > 0");
    TORCH_CHECK(rule[kMaxLen] >= 0, "cross_ids: cross ", x, " has a negative max_len");
    TORCH_CHECK(rule[kCount] >= 1 && rule[kFirst] >= 0 && rule[kFirst] <= column_count - rule[kCount],
                "cross_ids: cross ", x, "'s fields are not columns of the ", column_count, " given");
    for (int64_t c = rule[kFirst]; c < rule[kFirst] + rule[kCount]; ++c) {
      if (!checked[c]) check_column(columns, c, ids.numel());
      checked[c] = 1;
    }
    widest = std::max(widest, rule[kCount]);
  }

  // Each row's number of crosses, as its running sum: the crosses' offsets, and rooms.
  auto out_offsets = torch::empty({cross_count, n + 1}, offsets.options());
  auto out_starts = torch::empty({cross_count}, starts.options());
  int32_t* offset = out_offsets.data_ptr<int32_t>();
  int64_t* start = out_starts.data_ptr<int64_t>();
  std::vector<char> one_hot(cross_count);
  int64_t total = 0;
  for (int64_t x = 0; x < cross_count; ++x) {
    const int64_t* rule = rule_rows + x * kRuleFields;
    int32_t* o = offset + x * (n + 1);
    int64_t running = 0;
    o[0] = 0;
    one_hot[x] = one_each(columns, rule);
    for (int64_t i = 0; i < n; ++i) {
      running += one_hot[x] ? 1 : combinations(columns, rule, i);
      TORCH_CHECK(running <= std::numeric_limits<int32_t>::max(), "cross_ids: cross ", x,
                  " of more than 2^31 ids overflows its int32 offsets");
      o[i + 1] = static_cast<int32_t>(running);
    }
    start[x] = total;
    total += running;
  }

  auto out_ids = torch::empty({total}, ids.options());
  int64_t* out = out_ids.data_ptr<int64_t>();
  std::vector<const int64_t*> keys(widest);
  std::vector<int64_t> at(widest);
  std::vector<uint64_t> prefix(widest + 1);
  for (int64_t x = 0; x < cross_count; ++x) {
    const int64_t* rule = rule_rows + x * kRuleFields;
    const FastMod buckets(static_cast<uint64_t>(rule[kModulus]));
    if (one_hot[x]) {
      cross_each(columns, rule, buckets, out + start[x], keys);
      continue;
    }
    const int32_t* o = offset + x * (n + 1);
    for (int64_t i = 0; i < n; ++i) {
      if (o[i + 1] > o[i])
        cross_row(columns, rule, buckets, i, o[i + 1] - o[i], out + start[x] + o[i], keys, at, prefix);
    }
  }
  return {out_ids, out_offsets, out_starts};
}

}  // namespace

// The kernel releases the GIL: a batch decoding in one thread and a step computing in
// another then run side by side.
void register_ops(py::module_ m) {
  m.def("cross", &cross, "the feature crosses of a batch from its fields' decoded keys in one call",
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace picasso_kernels::cross_ids
