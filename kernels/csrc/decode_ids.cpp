// The id columns of one batch decoded in one call: every raw id (a string or an integer,
// alone or in a bag) hashed to its bucket, keyed, or range-checked, and every row a field
// refuses named with its first problem. The definition is kernels/decode_ids_reference.py
// (the contract: kernels/id_columns.py); the hash is picasso/hashing.py's, bit for bit.
//
// It reads the Arrow buffers in place: each column comes as a row of `columns`, the
// addresses and element offsets of its buffers (kernels/decode_ids_cpu.py reads them off
// the arrays, which the caller keeps alive for the call). Columns are independent, so
// they spread over torch's threads (ATen's parallel_for); each writes its ids from a
// start fixed beforehand (its room: the values it was given), so no thread waits on
// another and the result does not depend on the thread count.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "hashing.h"  // splitmix64, FastMod

// A namespace of its own: picasso_kernels.cpp compiles the sources as one unit.
namespace picasso_kernels::decode_ids {

namespace {

// The columns of a row of `columns`: first the column's buffers, as decode_ids_cpu.py
// writes them, then its rule, as id_columns.RULE_FIELDS.
enum Column : int64_t {
  kValueKind,      // kString, kLargeString, kSigned, kUnsigned
  kValueWidth,     // bytes per integer id
  kValues,         // integers, or the strings' characters
  kValueOffsets,   // the strings' offsets
  kValueValidity,  // 0: no nulls
  kValueStart,     // the values array's element offset
  kBagKind,        // kOnePerRow, kList, kLargeList
  kBagOffsets,
  kBagValidity,    // 0: no null lists
  kBagStart,       // the list array's element offset
  kRuleKind,       // kBucket, kKey, kVocab
  kModulus,
  kMaxLen,
  kStringStart,
  kIntegerMixed,
  kIntegerWord,
  kColumnFields,
};
enum ValueKind : int64_t { kString, kLargeString, kSigned, kUnsigned };
enum BagKind : int64_t { kOnePerRow, kList, kLargeList };
enum RuleKind : int64_t { kBucket, kKey, kVocab };
enum Problem : int64_t { kFine, kNullId, kNegativeId, kTooLong, kOutOfRange };

constexpr int64_t kGrainIds = 65536;  // ids per thread at least: waking a second thread costs more than hashing fewer

// hashing.hash_bytes: the length XOR start, then one mix per little-endian 8-byte word of
// the zero-padded bytes (at least one word).
inline uint64_t hash_bytes(const uint8_t* data, int64_t length, uint64_t start) {
  uint64_t h = static_cast<uint64_t>(length) ^ start;
  int64_t at = 0;
  for (; at + 8 <= length; at += 8) {
    uint64_t word;
    std::memcpy(&word, data + at, 8);
    h = splitmix64(h ^ word);
  }
  if (at < length || length == 0) {
    uint64_t word = 0;
    if (length > at) std::memcpy(&word, data + at, length - at);
    h = splitmix64(h ^ word);
  }
  return h;
}

inline bool bit(const uint8_t* bitmap, int64_t i) { return !bitmap || (bitmap[i >> 3] >> (i & 7)) & 1; }

// One column's buffers and rule, read from its row of `columns`.
struct IdColumn {
  int64_t value_kind, width;
  const uint8_t* values;
  const void* value_offsets;
  const uint8_t* value_validity;
  int64_t value_start;
  int64_t bag_kind;
  const void* bag_offsets;
  const uint8_t* bag_validity;
  int64_t bag_start;
  int64_t rule, modulus, max_len;
  uint64_t string_start, integer_word;
  bool integer_mixed;
  FastMod buckets;

  explicit IdColumn(const int64_t* row)
      : value_kind(row[kValueKind]),
        width(row[kValueWidth]),
        values(reinterpret_cast<const uint8_t*>(row[kValues])),
        value_offsets(reinterpret_cast<const void*>(row[kValueOffsets])),
        value_validity(reinterpret_cast<const uint8_t*>(row[kValueValidity])),
        value_start(row[kValueStart]),
        bag_kind(row[kBagKind]),
        bag_offsets(reinterpret_cast<const void*>(row[kBagOffsets])),
        bag_validity(reinterpret_cast<const uint8_t*>(row[kBagValidity])),
        bag_start(row[kBagStart]),
        rule(row[kRuleKind]),
        modulus(row[kModulus]),
        max_len(row[kMaxLen]),
        string_start(static_cast<uint64_t>(row[kStringStart])),
        integer_word(static_cast<uint64_t>(row[kIntegerWord])),
        integer_mixed(row[kIntegerMixed] != 0),
        buckets(static_cast<uint64_t>(row[kModulus])) {}

  bool strings() const { return value_kind == kString || value_kind == kLargeString; }

  // The list offset at position i of the list array (its element offset applied).
  int64_t bag_offset(int64_t i) const {
    i += bag_start;
    return bag_kind == kList ? static_cast<const int32_t*>(bag_offsets)[i] : static_cast<const int64_t*>(bag_offsets)[i];
  }

  // Value positions [begin, end) of row i's bag, and whether it is one (a null list, or a
  // null id alone in its row, is an empty bag).
  std::pair<int64_t, int64_t> bag(int64_t i) const {
    if (bag_kind == kOnePerRow) return {i, i + bit(value_validity, value_start + i)};
    if (!bit(bag_validity, bag_start + i)) return {0, 0};
    return {bag_offset(i), bag_offset(i + 1)};
  }

  // The values a column may take: what a room is sized by.
  int64_t room(int64_t n) const { return bag_kind == kOnePerRow ? n : (n ? bag_offset(n) - bag_offset(0) : 0); }

  bool null_id(int64_t j) const { return bag_kind != kOnePerRow && !bit(value_validity, value_start + j); }

  // Integer id j as its 64 bits, signed or not as its type.
  int64_t integer(int64_t j) const {
    const uint8_t* at = values + (value_start + j) * width;
    const bool sign = value_kind == kSigned;
    switch (width) {
      case 1: return sign ? int64_t(*reinterpret_cast<const int8_t*>(at)) : int64_t(*at);
      case 2: return sign ? int64_t(*reinterpret_cast<const int16_t*>(at)) : int64_t(*reinterpret_cast<const uint16_t*>(at));
      case 4: return sign ? int64_t(*reinterpret_cast<const int32_t*>(at)) : int64_t(*reinterpret_cast<const uint32_t*>(at));
      default: return *reinterpret_cast<const int64_t*>(at);
    }
  }

  uint64_t string_hash(int64_t j) const {
    j += value_start;
    int64_t begin, end;
    if (value_kind == kString) {
      begin = static_cast<const int32_t*>(value_offsets)[j];
      end = static_cast<const int32_t*>(value_offsets)[j + 1];
    } else {
      begin = static_cast<const int64_t*>(value_offsets)[j];
      end = static_cast<const int64_t*>(value_offsets)[j + 1];
    }
    return hash_bytes(values + begin, end - begin, string_start);
  }

  // The first problem of the bag [begin, end), in the decoder's order, and its detail.
  std::pair<Problem, int64_t> problem(int64_t begin, int64_t end) const {
    if (value_validity) {
      for (int64_t j = begin; j < end; ++j)
        if (null_id(j)) return {kNullId, 0};
    }
    if (rule != kVocab && value_kind == kSigned) {
      for (int64_t j = begin; j < end; ++j)
        if (integer(j) < 0) return {kNegativeId, integer(j)};
    }
    if (end - begin > max_len) return {kTooLong, end - begin};
    if (rule == kVocab) {
      for (int64_t j = begin; j < end; ++j) {
        const int64_t v = integer(j);
        // An unsigned id past 2^63 reads as negative: out of range too.
        if (v < 0 || v >= modulus) return {kOutOfRange, 0};
      }
    }
    return {kFine, 0};
  }

  int64_t row_of(int64_t j) const {
    if (rule == kVocab) return integer(j);
    uint64_t h;
    if (strings()) {
      h = string_hash(j);
    } else {
      const uint64_t v = static_cast<uint64_t>(integer(j));
      h = rule == kBucket ? splitmix64(v) : integer_mixed ? splitmix64(v ^ integer_word) : v;
    }
    return rule == kBucket ? static_cast<int64_t>(buckets(h)) : static_cast<int64_t>(h);
  }

  // Every row a bag of one id, none null: no row can be refused but for a negative or
  // out-of-range integer id (or a max_len under 1), which the general loop handles.
  bool one_each() const { return bag_kind == kOnePerRow && !value_validity && max_len >= 1; }
};

using ProblemRow = std::array<int64_t, 3>;  // row, code, detail

// IdColumn::row_of for n strings, one per row, with the checks of its kind and rule made
// once for the column rather than once per id.
template <typename Offset>
void hash_each(const IdColumn& column, const Offset* offsets, int64_t n, int64_t* out) {
  const uint8_t* data = column.values;
  const uint64_t start = column.string_start;
  if (column.rule == kBucket) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<int64_t>(column.buckets(hash_bytes(data + offsets[i], offsets[i + 1] - offsets[i], start)));
  } else {
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<int64_t>(hash_bytes(data + offsets[i], offsets[i + 1] - offsets[i], start));
  }
}

// One column: its bags' ids from `out` on (the rest of its room zero), their offsets, and
// its refused rows (whose bags are empty).
void decode_column(const IdColumn& column, int64_t n, int64_t room, int64_t* out, int32_t* offsets,
                   std::vector<ProblemRow>& problems) {
  int64_t written = 0;
  offsets[0] = 0;
  if (column.one_each() && column.strings()) {  // the usual column: a string id per row
    if (column.value_kind == kString) {
      hash_each(column, static_cast<const int32_t*>(column.value_offsets) + column.value_start, n, out);
    } else {
      hash_each(column, static_cast<const int64_t*>(column.value_offsets) + column.value_start, n, out);
    }
    for (int64_t i = 0; i < n; ++i) offsets[i + 1] = static_cast<int32_t>(i + 1);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto [begin, end] = column.bag(i);
    const auto [code, detail] = column.problem(begin, end);
    if (code != kFine) {
      problems.push_back({i, code, detail});
    } else {
      for (int64_t j = begin; j < end; ++j) out[written++] = column.row_of(j);
    }
    offsets[i + 1] = static_cast<int32_t>(written);
  }
  std::fill(out + written, out + room, 0);
}

// (ids, offsets (C, n + 1) int32, starts (C,), problems (P, 4)): see id_columns.DecodedIds.
std::vector<torch::Tensor> decode(torch::Tensor columns, int64_t n) {
  TORCH_CHECK(columns.scalar_type() == torch::kInt64 && columns.is_contiguous() && columns.dim() == 2 &&
                  columns.size(1) == kColumnFields,
              "columns must be contiguous int64 (columns, ", int64_t(kColumnFields), ")");
  const int64_t count = columns.size(0);
  const int64_t* rows = columns.data_ptr<int64_t>();
  std::vector<IdColumn> id_columns;
  id_columns.reserve(count);
  auto starts = torch::empty({count}, columns.options());
  int64_t* start = starts.data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t c = 0; c < count; ++c) {
    id_columns.emplace_back(rows + c * kColumnFields);
    start[c] = total;
    const int64_t room = id_columns.back().room(n);
    TORCH_CHECK(room < (int64_t(1) << 31), "a column of ", room, " ids overflows its int32 offsets");
    total += room;
  }
  auto ids = torch::empty({total}, columns.options());
  auto offsets = torch::empty({count, n + 1}, columns.options().dtype(torch::kInt32));
  int64_t* id = ids.data_ptr<int64_t>();
  int32_t* offset = offsets.data_ptr<int32_t>();
  std::vector<std::vector<ProblemRow>> problems(count);
  const int64_t grain = std::max<int64_t>(1, kGrainIds / std::max<int64_t>(1, total / std::max<int64_t>(1, count)));
  at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t room = (c + 1 < count ? start[c + 1] : total) - start[c];
      decode_column(id_columns[c], n, room, id + start[c], offset + c * (n + 1), problems[c]);
    }
  });
  int64_t refused = 0;
  for (const auto& p : problems) refused += static_cast<int64_t>(p.size());
  auto found = torch::empty({refused, 4}, columns.options());
  int64_t* f = found.data_ptr<int64_t>();
  for (int64_t c = 0; c < count; ++c) {
    for (const auto& [row, code, detail] : problems[c]) {
      *f++ = c;
      *f++ = row;
      *f++ = code;
      *f++ = detail;
    }
  }
  return {ids, offsets, starts, found};
}

}  // namespace

// The kernel releases the GIL: a batch decoding in one thread and a step computing in
// another then run side by side.
void register_ops(py::module_ m) {
  m.def("decode", &decode, "the id columns of a batch hashed, bucketed and checked in one call",
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace picasso_kernels::decode_ids
