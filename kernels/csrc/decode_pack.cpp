// A raw Arrow record batch decoded, checked and packed in one call: the label, the dense
// values, every sparse field's ids (decode_ids.cpp) packed group by group
// (pack_groups.cpp), and each row's verdict: the first check it fails, in the
// validator's order (label, then dense fields, then sparse fields, in spec order). Rows
// refused are left out of the packed tensors. No canonical table is made.
//
// The definition is the reference path, connectors.decoding's RecordDecoder.decode_table
// followed by picasso.batch.pack; kernels/fused_batch.py is the contract and
// tests/test_decode_pack.py holds the two together.
//
// The batch comes through the Arrow C data interface (RecordBatch._export_to_c, once per
// batch: one struct array, a child per column), so no Python runs per column. A column of
// a type this op does not judge as the reference does (dictionaries, booleans, float16,
// binary, nested lists...) makes it decline the whole batch (an empty result): the caller
// then takes the reference path. The dense transform (log1p) is the caller's too: numpy's
// log1p is the definition and can differ from libm's in the last bit.

#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

// It calls decode_ids::decode and pack_groups::pack, which picasso_kernels.cpp includes
// before it (sources have no include guards: the unit includes each once).

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE
// The Arrow C data interface's two structs, as its specification gives them.
struct ArrowSchema {
  const char* format;
  const char* name;
  const char* metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema** children;
  struct ArrowSchema* dictionary;
  void (*release)(struct ArrowSchema*);
  void* private_data;
};

struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void** buffers;
  struct ArrowArray** children;
  struct ArrowArray* dictionary;
  void (*release)(struct ArrowArray*);
  void* private_data;
};
#endif

// A namespace of its own: picasso_kernels.cpp compiles the sources as one unit.
namespace picasso_kernels::decode_pack {

namespace {

namespace ids = picasso_kernels::decode_ids;

// Verdict stages and codes, as kernels/fused_batch.py names them (KEPT, LABEL...).
enum Stage : int64_t { kKept, kLabel, kDense, kSparse };
enum LabelCode : int64_t { kMissingLabel = 1, kLabelNotFinite, kLabelOutOfRange };
constexpr int64_t kVerdictFields = 5;  // row, stage, code, field, detail

// What a spec asks of a batch, made once per spec (decode_pack.FusedPlan): which column is
// which field, and each sparse field's rule (id_columns.RULE_FIELDS) and packing group.
struct Plan {
  std::unordered_map<std::string, int64_t> slot_of;  // column name -> 0 label, 1 + j dense, 1 + d + k sparse
  int64_t num_dense, num_sparse;
  std::vector<char> log1p;  // per dense field: its values never overflow a float32
  std::vector<int64_t> rules;  // (sparse, 6) row-major
  std::vector<std::vector<int64_t>> groups, id_offsets;
  bool require_label, reject_unknown;

  Plan(const std::string& label, const std::vector<std::string>& dense, const std::vector<bool>& dense_log1p,
       const std::vector<std::string>& sparse, torch::Tensor rule_matrix, std::vector<std::vector<int64_t>> groups_,
       std::vector<std::vector<int64_t>> id_offsets_, bool require_label_, bool reject_unknown_)
      : num_dense(static_cast<int64_t>(dense.size())),
        num_sparse(static_cast<int64_t>(sparse.size())),
        log1p(dense_log1p.begin(), dense_log1p.end()),
        groups(std::move(groups_)),
        id_offsets(std::move(id_offsets_)),
        require_label(require_label_),
        reject_unknown(reject_unknown_) {
    TORCH_CHECK(rule_matrix.scalar_type() == torch::kInt64 && rule_matrix.is_contiguous() &&
                    rule_matrix.dim() == 2 && rule_matrix.size(0) == num_sparse &&
                    rule_matrix.size(1) == ids::kColumnFields - ids::kRuleKind,
                "rules must be contiguous int64 (sparse fields, rule fields)");
    rules.assign(rule_matrix.data_ptr<int64_t>(), rule_matrix.data_ptr<int64_t>() + rule_matrix.numel());
    slot_of[label] = 0;
    for (int64_t j = 0; j < num_dense; ++j) slot_of[dense[j]] = 1 + j;
    for (int64_t k = 0; k < num_sparse; ++k) slot_of[sparse[k]] = 1 + num_dense + k;
    TORCH_CHECK(static_cast<int64_t>(slot_of.size()) == 1 + num_dense + num_sparse, "field names must be unique");
  }
};

// Releases the exported batch however the call ends: the C data interface leaves that to
// the consumer.
struct Exported {
  ArrowArray* array;
  ArrowSchema* schema;
  ~Exported() {
    if (array->release) array->release(array);
    if (schema->release) schema->release(schema);
  }
};

bool is(const char* format, const char* name) { return std::strcmp(format, name) == 0; }

// The number formats a label or dense column may have: what the validator casts to float64.
bool number_format(const char* f) {
  return is(f, "c") || is(f, "C") || is(f, "s") || is(f, "S") || is(f, "i") || is(f, "I") || is(f, "l") ||
         is(f, "L") || is(f, "f") || is(f, "g");
}

// A label or dense column: its values read as float64, nulls (and the null type) as 0.
struct NumberColumn {
  char format = 'n';  // 'n': absent, or Arrow's null type
  const void* values = nullptr;
  const uint8_t* validity = nullptr;
  int64_t start = 0;

  bool null(int64_t i) const { return format == 'n' || !ids::bit(validity, start + i); }

  double at(int64_t i) const {
    const int64_t j = start + i;
    switch (format) {
      case 'c': return static_cast<const int8_t*>(values)[j];
      case 'C': return static_cast<const uint8_t*>(values)[j];
      case 's': return static_cast<const int16_t*>(values)[j];
      case 'S': return static_cast<const uint16_t*>(values)[j];
      case 'i': return static_cast<const int32_t*>(values)[j];
      case 'I': return static_cast<const uint32_t*>(values)[j];
      case 'l': return static_cast<double>(static_cast<const int64_t*>(values)[j]);
      case 'L': return static_cast<double>(static_cast<const uint64_t*>(values)[j]);
      case 'f': return static_cast<const float*>(values)[j];
      case 'g': return static_cast<const double*>(values)[j];
      default: return 0.0;
    }
  }

  // The validator's value: 0 where null; adding 0.0 turns -0.0 into 0.0.
  double value(int64_t i) const { return (null(i) ? 0.0 : at(i)) + 0.0; }
};

const uint8_t* validity_of(const ArrowArray* a) {
  return a->null_count == 0 || a->n_buffers == 0 ? nullptr : static_cast<const uint8_t*>(a->buffers[0]);
}

// Where a column's own nulls are (its validity, or every row for the null type), for
// the absent counts; `start` is its first row's bit.
struct Presence {
  bool missing = true;  // no such column, or the null type
  const uint8_t* validity = nullptr;
  int64_t start = 0;
};

// A sparse column as a row of decode_ids' `columns` (its enum Column), without the rule;
// false where decode_ids does not take it as the validator would (decline the batch).
bool id_column_row(const ArrowSchema* s, const ArrowArray* a, int64_t start, bool takes_strings, int64_t* row) {
  std::fill(row, row + ids::kRuleKind, 0);
  const bool large = is(s->format, "+L");
  if (is(s->format, "+l") || large) {
    if (s->n_children != 1 || a->n_children != 1 || s->children[0]->dictionary) return false;
    row[ids::kBagKind] = large ? ids::kLargeList : ids::kList;
    row[ids::kBagOffsets] = reinterpret_cast<int64_t>(a->buffers[1]);
    row[ids::kBagValidity] = reinterpret_cast<int64_t>(validity_of(a));
    row[ids::kBagStart] = start;
    s = s->children[0];
    a = a->children[0];
    start = a->offset;  // list offsets index into the child, past its own offset
  } else {
    row[ids::kBagKind] = ids::kOnePerRow;
  }
  const char* f = s->format;
  row[ids::kValueValidity] = reinterpret_cast<int64_t>(validity_of(a));
  row[ids::kValueStart] = start;
  if (is(f, "u") || is(f, "U")) {
    if (!takes_strings) return false;  // a vocab field's strings: the validator's per-id path names them
    row[ids::kValueKind] = is(f, "u") ? ids::kString : ids::kLargeString;
    row[ids::kValueOffsets] = reinterpret_cast<int64_t>(a->buffers[1]);
    row[ids::kValues] = reinterpret_cast<int64_t>(a->buffers[2]);
    return true;
  }
  static const char* const kSigned[] = {"c", "s", "i", "l"};
  static const char* const kUnsigned[] = {"C", "S", "I", "L"};
  for (int64_t w = 0; w < 4; ++w) {
    const bool sign = is(f, kSigned[w]);
    if (sign || is(f, kUnsigned[w])) {
      row[ids::kValueKind] = sign ? ids::kSigned : ids::kUnsigned;
      row[ids::kValueWidth] = int64_t(1) << w;
      row[ids::kValues] = reinterpret_cast<int64_t>(a->buffers[1]);
      return true;
    }
  }
  return false;
}

struct Verdict {
  int64_t stage = kKept, code = 0, field = 0, detail = 0;
};

int64_t bits_of(double v) {
  int64_t b;
  std::memcpy(&b, &v, 8);
  return b;
}

// Kept rows' values of one decoded column: its bags of the kept rows from offset 0, their
// ids moved up over those of the rows left out.
void compact(const int32_t* offsets, const int64_t* values, const std::vector<int64_t>& kept, int32_t* out_offsets,
             int64_t* out_values) {
  int32_t written = 0;
  out_offsets[0] = 0;
  for (size_t r = 0; r < kept.size(); ++r) {
    const int32_t begin = offsets[kept[r]], end = offsets[kept[r] + 1];
    if (end > begin) std::memcpy(out_values + written, values + begin, sizeof(int64_t) * (end - begin));
    written += end - begin;
    out_offsets[r + 1] = written;
  }
}

// (label (kept,) float32, dense (kept, d) float64, valid (n,) bool, verdicts (refused, 5)
// int64, absent (d + s,) int64, then per group its ids and bag starts): see
// decode_pack.FusedBatch. Empty where the batch has a column the op declines.
std::vector<torch::Tensor> decode_pack(const Plan& plan, int64_t array_address, int64_t schema_address) {
  Exported batch{reinterpret_cast<ArrowArray*>(array_address), reinterpret_cast<ArrowSchema*>(schema_address)};
  const ArrowArray* top = batch.array;
  const ArrowSchema* schema = batch.schema;
  if (!is(schema->format, "+s") || schema->n_children != top->n_children || top->null_count > 0) return {};
  const int64_t n = top->length, d = plan.num_dense, s = plan.num_sparse;

  // Each field's column, the last of its name (as a dict of the columns keeps it).
  std::vector<int64_t> child_of(1 + d + s, -1);
  for (int64_t c = 0; c < schema->n_children; ++c) {
    const auto found = plan.slot_of.find(schema->children[c]->name ? schema->children[c]->name : "");
    if (found != plan.slot_of.end()) {
      child_of[found->second] = c;
    } else if (plan.reject_unknown) {
      return {};  // an unknown field to refuse: the reference's
    }
  }

  // The label and dense columns.
  std::vector<NumberColumn> numbers(1 + d);
  std::vector<Presence> presence(d + s);  // dense, then sparse: spec.feature_names
  for (int64_t slot = 0; slot <= d; ++slot) {
    const int64_t c = child_of[slot];
    if (c < 0) continue;
    const ArrowSchema* cs = schema->children[c];
    const ArrowArray* ca = top->children[c];
    const int64_t start = top->offset + ca->offset;
    if (cs->dictionary) return {};
    if (!is(cs->format, "n")) {
      if (!number_format(cs->format)) return {};
      numbers[slot] = NumberColumn{cs->format[0], ca->buffers[1], validity_of(ca), start};
    }
    if (slot > 0) presence[slot - 1] = Presence{is(cs->format, "n"), validity_of(ca), start};
  }

  // The sparse columns, as decode_ids takes them: every present one, in spec order.
  constexpr int64_t kRuleFields = ids::kColumnFields - ids::kRuleKind;
  std::vector<int64_t> decoded_of(s, -1), sparse_of;  // field -> decoded column, and back
  std::vector<int64_t> rows;
  for (int64_t k = 0; k < s; ++k) {
    const int64_t c = child_of[1 + d + k];
    if (c < 0) continue;
    const ArrowSchema* cs = schema->children[c];
    const ArrowArray* ca = top->children[c];
    const int64_t start = top->offset + ca->offset;
    if (cs->dictionary) return {};
    if (is(cs->format, "n")) continue;  // all null: empty bags, as a missing column's
    presence[d + k] = Presence{false, validity_of(ca), start};
    const int64_t* rule = plan.rules.data() + k * kRuleFields;
    rows.resize(rows.size() + ids::kColumnFields);
    int64_t* row = rows.data() + rows.size() - ids::kColumnFields;
    if (!id_column_row(cs, ca, start, rule[0] != ids::kVocab, row)) return {};
    std::copy(rule, rule + kRuleFields, row + ids::kRuleKind);
    decoded_of[k] = static_cast<int64_t>(sparse_of.size());
    sparse_of.push_back(k);
  }
  const int64_t count = static_cast<int64_t>(sparse_of.size());
  auto long_options = torch::TensorOptions().dtype(torch::kInt64);
  auto columns = torch::empty({count, ids::kColumnFields}, long_options);
  if (count) std::memcpy(columns.data_ptr<int64_t>(), rows.data(), sizeof(int64_t) * rows.size());
  const auto decoded = ids::decode(columns, n);
  const int64_t* decoded_ids = decoded[0].data_ptr<int64_t>();
  const int32_t* decoded_offsets = decoded[1].data_ptr<int32_t>();
  const int64_t* decoded_starts = decoded[2].data_ptr<int64_t>();

  // Each row's first failed check: label, dense fields, then sparse fields, each in order.
  std::vector<Verdict> verdicts(n);
  const NumberColumn& label = numbers[0];
  if (plan.require_label) {
    for (int64_t i = 0; i < n; ++i) {
      if (label.null(i)) {
        verdicts[i] = {kLabel, kMissingLabel, 0, 0};
      } else {
        const double v = label.at(i);
        if (!std::isfinite(v)) verdicts[i] = {kLabel, kLabelNotFinite, 0, bits_of(v)};
        else if (v < 0 || v > 1) verdicts[i] = {kLabel, kLabelOutOfRange, 0, bits_of(v)};
      }
    }
  }
  for (int64_t j = 0; j < d; ++j) {
    const NumberColumn& column = numbers[1 + j];
    if (column.format == 'n') continue;
    const bool may_overflow = !plan.log1p[j];  // sign(x)·log(1+|x|) of a finite x always fits
    for (int64_t i = 0; i < n; ++i) {
      if (verdicts[i].stage != kKept) continue;
      const double v = column.value(i);
      if (!std::isfinite(v) || (may_overflow && std::isinf(static_cast<float>(v))))
        verdicts[i] = {kDense, 0, j, bits_of(v)};
    }
  }
  const int64_t problems = decoded[3].size(0);
  const int64_t* problem = decoded[3].data_ptr<int64_t>();
  for (int64_t p = 0; p < problems; ++p, problem += 4) {  // by column, then row: a row's first is its first field's
    Verdict& v = verdicts[problem[1]];
    if (v.stage == kKept) v = {kSparse, problem[2], sparse_of[problem[0]], problem[3]};
  }

  std::vector<int64_t> kept;
  kept.reserve(n);
  auto valid = torch::empty({n}, torch::TensorOptions().dtype(torch::kBool));
  bool* is_valid = valid.data_ptr<bool>();
  int64_t refused = 0;
  for (int64_t i = 0; i < n; ++i) {
    is_valid[i] = verdicts[i].stage == kKept;
    if (is_valid[i]) kept.push_back(i);
    else ++refused;
  }
  const int64_t m = static_cast<int64_t>(kept.size());
  auto verdict_rows = torch::empty({refused, kVerdictFields}, long_options);
  int64_t* out = verdict_rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const Verdict& v = verdicts[i];
    if (v.stage == kKept) continue;
    *out++ = i;
    *out++ = v.stage;
    *out++ = v.code;
    *out++ = v.field;
    *out++ = v.detail;
  }

  // The kept rows' label and dense values (the dense transform is the caller's).
  auto labels = torch::empty({m}, torch::TensorOptions().dtype(torch::kFloat32));
  float* label_out = labels.data_ptr<float>();
  for (int64_t r = 0; r < m; ++r) label_out[r] = static_cast<float>(label.value(kept[r]));
  auto dense = torch::empty({m, d}, torch::TensorOptions().dtype(torch::kFloat64));
  double* dense_out = dense.data_ptr<double>();
  for (int64_t j = 0; j < d; ++j) {
    const NumberColumn& column = numbers[1 + j];
    for (int64_t r = 0; r < m; ++r) dense_out[r * d + j] = column.value(kept[r]);
  }

  // Per feature (dense, then sparse), the kept rows that lack it.
  auto absent = torch::zeros({d + s}, long_options);
  int64_t* absent_out = absent.data_ptr<int64_t>();
  for (int64_t f = 0; f < d + s; ++f) {
    const Presence& p = presence[f];
    if (p.missing) {
      absent_out[f] = m;
    } else if (p.validity) {
      for (int64_t r = 0; r < m; ++r) absent_out[f] += !ids::bit(p.validity, p.start + kept[r]);
    }
  }

  // The kept rows' bags, column by column: the decoded ones as they are when every row is
  // kept, else compacted; an absent field's are all empty.
  std::vector<int32_t> no_bags(m + 1, 0);
  std::vector<int32_t> kept_offsets;
  std::vector<int64_t> kept_values;
  std::vector<int64_t> kept_starts(count);
  if (m < n && count) {
    kept_offsets.resize(count * (m + 1));
    int64_t total = 0;
    for (int64_t c = 0; c < count; ++c) {
      kept_starts[c] = total;
      const int32_t* o = decoded_offsets + c * (n + 1);
      for (const int64_t i : kept) total += o[i + 1] - o[i];
    }
    kept_values.resize(total);
    for (int64_t c = 0; c < count; ++c)
      compact(decoded_offsets + c * (n + 1), decoded_ids + decoded_starts[c], kept,
              kept_offsets.data() + c * (m + 1), kept_values.data() + kept_starts[c]);
  }
  std::vector<torch::Tensor> result = {labels, dense, valid, verdict_rows, absent};
  std::vector<int64_t> fields;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const auto& members = plan.groups[g];
    fields.assign(members.size() * pack_groups::kFieldColumns, 0);
    for (size_t f = 0; f < members.size(); ++f) {
      int64_t* row = fields.data() + f * pack_groups::kFieldColumns;
      const int64_t c = decoded_of[members[f]];
      const int32_t* offsets = no_bags.data();
      const int64_t* values = nullptr;
      if (c >= 0 && m == n) {
        offsets = decoded_offsets + c * (n + 1);
        values = decoded_ids + decoded_starts[c];
      } else if (c >= 0) {
        offsets = kept_offsets.data() + c * (m + 1);
        values = kept_values.data() + kept_starts[c];
      }
      row[pack_groups::kOffsets] = reinterpret_cast<int64_t>(offsets);
      row[pack_groups::kValues] = reinterpret_cast<int64_t>(values);
      row[pack_groups::kIdOffset] = plan.id_offsets[g][f];
    }
    auto table = torch::from_blob(fields.data(), {static_cast<int64_t>(members.size()), pack_groups::kFieldColumns},
                                  long_options);
    const auto packed = pack_groups::pack(table, m);
    result.push_back(packed[0]);
    result.push_back(packed[1]);
  }
  return result;
}

}  // namespace

// The kernel releases the GIL: a batch decoding in one thread and a step computing in
// another then run side by side.
void register_ops(py::module_ m) {
  py::class_<Plan>(m, "Plan")
      .def(py::init<const std::string&, const std::vector<std::string>&, const std::vector<bool>&,
                    const std::vector<std::string>&, torch::Tensor, std::vector<std::vector<int64_t>>,
                    std::vector<std::vector<int64_t>>, bool, bool>());
  m.def("decode_pack", &decode_pack, "a raw Arrow batch decoded, checked and packed in one call",
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace picasso_kernels::decode_pack
