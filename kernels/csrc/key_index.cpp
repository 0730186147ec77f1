// A map of int64 keys to int64 values, whole batches at a time: the sample join's index
// of its records (picasso.key_index.KeyIndex), where a Python dict cost a third of the
// join's time at a million pending impressions (a dict lookup and insert per event, and
// an int object per key and value).
//
// The index is the id map's: an int64 (slots, 2) tensor of (key, value) pairs, linear
// probing from the top bits of splitmix64(key), backward-shift deletion, EMPTY_KEY marking
// an empty slot (id_map.cpp's Probing, compiled before this source in picasso_kernels.cpp).
// The caller keeps it at most half full and grows it with `rehash`. A lookup reads only,
// on torch's threads; changes go key by key in the order given, on one thread, so that a
// key given twice in one call behaves as two calls would.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

// A namespace of its own: picasso_kernels.cpp compiles the sources as one unit.
namespace picasso_kernels::key_index {

namespace {

using id_map::kEmptyKey;
using id_map::kGrainKeys;
using id_map::Probing;
using id_map::Slot;

Probing probing_of(const char* op, torch::Tensor& index) {
  TORCH_CHECK(index.device().is_cpu() && index.scalar_type() == torch::kInt64 && index.dim() == 2 &&
                  index.size(1) == 2 && index.is_contiguous(),
              op, ": index must be a contiguous int64 (slots, 2) host tensor, not ", index.scalar_type(), " of shape ",
              index.sizes());
  const int64_t slots = index.size(0);
  TORCH_CHECK(slots >= 2 && (slots & (slots - 1)) == 0, op, ": index slots must be a power of two, not ", slots);
  return Probing(reinterpret_cast<Slot*>(index.data_ptr<int64_t>()), slots);
}

void check_keys(const char* op, const torch::Tensor& keys, const char* name = "keys") {
  TORCH_CHECK(keys.device().is_cpu() && keys.scalar_type() == torch::kInt64 && keys.dim() == 1 && keys.is_contiguous(),
              op, ": ", name, " must be a contiguous 1-d int64 host tensor, not ", keys.scalar_type(), " of shape ",
              keys.sizes());
}

void check_pairs(const char* op, const torch::Tensor& keys, const torch::Tensor& values) {
  check_keys(op, keys);
  check_keys(op, values, "values");
  TORCH_CHECK(keys.numel() == values.numel(), op, ": one value per key (", keys.numel(), " keys, ", values.numel(),
              " values)");
  const int64_t* key = keys.data_ptr<int64_t>();
  for (int64_t i = 0; i < keys.numel(); ++i)
    TORCH_CHECK(key[i] != kEmptyKey, op, ": the key ", kEmptyKey, " marks an empty slot and cannot be held");
}

}  // namespace

// Each key's value, or -1 where the index does not hold it.
torch::Tensor find(torch::Tensor index, torch::Tensor keys) {
  const Probing map = probing_of("key_index find", index);
  check_keys("key_index find", keys);
  auto values = torch::empty({keys.numel()}, keys.options());
  const int64_t* key = keys.data_ptr<int64_t>();
  int64_t* value = values.data_ptr<int64_t>();
  at::parallel_for(0, keys.numel(), kGrainKeys,
                   [&](int64_t begin, int64_t end) { map.rows_of(key + begin, end - begin, value + begin); });
  return values;
}

// Hold each key that is not held yet, with its value, in order; returns, per key, whether
// it was held already (then its value is left as it was): a key given twice is added
// once, and its second is reported held.
torch::Tensor add(torch::Tensor index, torch::Tensor keys, torch::Tensor values) {
  Probing map = probing_of("key_index add", index);
  check_pairs("key_index add", keys, values);
  auto held = torch::zeros({keys.numel()}, keys.options().dtype(torch::kBool));
  const int64_t* key = keys.data_ptr<int64_t>();
  const int64_t* value = values.data_ptr<int64_t>();
  bool* was_held = held.data_ptr<bool>();
  for (int64_t i = 0; i < keys.numel(); ++i) {
    if (map.slot_of(key[i], map.home(key[i])) >= 0)
      was_held[i] = true;
    else
      map.insert(key[i], value[i]);
  }
  return held;
}

// Give held keys new values.
void assign(torch::Tensor index, torch::Tensor keys, torch::Tensor values) {
  Probing map = probing_of("key_index assign", index);
  check_pairs("key_index assign", keys, values);
  const int64_t* key = keys.data_ptr<int64_t>();
  const int64_t* value = values.data_ptr<int64_t>();
  for (int64_t i = 0; i < keys.numel(); ++i) {
    const int64_t slot = map.slot_of(key[i], map.home(key[i]));
    TORCH_CHECK(slot >= 0, "key_index assign: the key ", key[i], " is not held");
    map.slots[slot].row = value[i];
  }
}

// Let go of held keys.
void remove(torch::Tensor index, torch::Tensor keys) {
  Probing map = probing_of("key_index remove", index);
  check_keys("key_index remove", keys);
  const int64_t* key = keys.data_ptr<int64_t>();
  for (int64_t i = 0; i < keys.numel(); ++i)
    TORCH_CHECK(key[i] != kEmptyKey && map.erase(key[i]), "key_index remove: the key ", key[i], " is not held");
}

// Every pair of `from` into the empty index `into` (a bigger one, as the map grows).
void rehash(torch::Tensor into, torch::Tensor from) {
  Probing map = probing_of("key_index rehash", into);
  const Probing old = probing_of("key_index rehash", from);
  for (uint64_t slot = 0; slot <= old.mask; ++slot)
    if (old.slots[slot].key != kEmptyKey) map.insert(old.slots[slot].key, old.slots[slot].row);
}

// The kernels release the GIL, as the others do.
void register_ops(py::module_ m) {
  m.def("find", &find, "each key's value, or -1", py::call_guard<py::gil_scoped_release>());
  m.def("add", &add, "hold the keys not held yet; whether each was held", py::call_guard<py::gil_scoped_release>());
  m.def("assign", &assign, "new values for held keys", py::call_guard<py::gil_scoped_release>());
  m.def("remove", &remove, "let go of held keys", py::call_guard<py::gil_scoped_release>());
  m.def("rehash", &rehash, "every pair into a bigger index", py::call_guard<py::gil_scoped_release>());
}

}  // namespace picasso_kernels::key_index
