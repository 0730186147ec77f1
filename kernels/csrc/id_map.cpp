// CPU kernels of a dynamic table's id -> row map. The definition they implement, tensor
// for tensor (the index's layout included), is kernels/id_map_reference.py: the same
// linear probing from the same home slot, the same backward-shift deletion, and inserts and
// deletes in the same order, so both leave every slot the same.
//
// find's probes only read the index and run on torch's threads (ATen's parallel_for); its
// bookkeeping (last_seen, counts, the misses in order of first occurrence) is one serial
// pass after them, so its results never depend on the thread count. admit, expire and
// rebuild change the index key by key, in the reference's order, on one thread.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

// A namespace of its own: picasso_kernels.cpp compiles the three sources as one unit.
namespace picasso_kernels::id_map {

namespace {

constexpr int64_t kEmptyKey = std::numeric_limits<int64_t>::min();
constexpr int64_t kPrefetchDistance = 16;  // keys ahead: enough to hide an index slot's DRAM miss
constexpr int64_t kGrainKeys = 8192;       // keys per thread at least: a probe is a few ns
constexpr int64_t kBlockKeys = 256;        // home slots computed ahead of their probes, per block

// One slot of the index, (key, row) side by side: a probe that finds its key has its row
// in the same cache line. (kEmptyKey, -1) when empty.
struct Slot {
  int64_t key;
  int64_t row;
};
static_assert(sizeof(Slot) == 16, "a slot is the index's (key, row) pair of int64");

// splitmix64's finaliser of key + golden ratio, as id_map_reference.home_slots.
inline uint64_t mix(int64_t key) {
  uint64_t z = static_cast<uint64_t>(key) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// An open-addressing table of 2^bits slots: a key's home is the top bits of mix(key).
struct Probing {
  Slot* slots;
  uint64_t mask;
  int shift;

  Probing(Slot* slots_, int64_t count) : slots(slots_), mask(count - 1), shift(64 - __builtin_ctzll(count)) {}

  int64_t home(int64_t key) const { return static_cast<int64_t>(mix(key) >> shift); }

  // The slot holding key, found from its home, or -1.
  int64_t slot_of(int64_t key, uint64_t from) const {
    for (uint64_t slot = from;; slot = (slot + 1) & mask) {
      if (slots[slot].key == key) return static_cast<int64_t>(slot);
      if (slots[slot].key == kEmptyKey) return -1;
    }
  }

  // Into the first empty slot from home; returns that slot. As in the reference, the key
  // is not looked for first: admit is given misses.
  int64_t insert(int64_t key, int64_t row) {
    uint64_t slot = home(key);
    while (slots[slot].key != kEmptyKey) slot = (slot + 1) & mask;
    slots[slot] = {key, row};
    return static_cast<int64_t>(slot);
  }

  // The row of each key (-1 when absent, or EMPTY_KEY), read only. The home slots of a
  // block of keys come first, so that each probe's first slot can be fetched
  // kPrefetchDistance keys before it is read: lookups are scattered over megabytes of index.
  void rows_of(const int64_t* key, int64_t n, int64_t* row) const {
    int64_t home_of[kBlockKeys];
    for (int64_t start = 0; start < n; start += kBlockKeys) {
      const int64_t count = std::min(kBlockKeys, n - start);
      for (int64_t j = 0; j < count; ++j) home_of[j] = home(key[start + j]);
      for (int64_t j = 0; j < std::min(kPrefetchDistance, count); ++j) __builtin_prefetch(slots + home_of[j]);
      for (int64_t j = 0; j < count; ++j) {
        if (j + kPrefetchDistance < count) __builtin_prefetch(slots + home_of[j + kPrefetchDistance]);
        const int64_t k = key[start + j];
        const int64_t slot = k == kEmptyKey ? -1 : slot_of(k, home_of[j]);
        row[start + j] = slot < 0 ? -1 : slots[slot].row;
      }
    }
  }

  // Remove key, shifting back the entries after it in its probe run that may move: those
  // whose home does not lie between the hole and where they are (cyclically). False when
  // the key is not there.
  bool erase(int64_t key) {
    int64_t hole = slot_of(key, home(key));
    if (hole < 0) return false;
    slots[hole] = {kEmptyKey, -1};
    for (int64_t probe = (hole + 1) & mask; slots[probe].key != kEmptyKey; probe = (probe + 1) & mask) {
      const int64_t at = home(slots[probe].key);
      const bool stays = hole <= probe ? hole < at && at <= probe : at > hole || at <= probe;
      if (!stays) {
        slots[hole] = slots[probe];
        slots[probe] = {kEmptyKey, -1};
        hole = probe;
      }
    }
    return true;
  }
};

// The tensors of one map, as map_of checked them.
struct Map : Probing {
  int64_t capacity;
  int64_t* row_keys;
  int64_t* last_seen;
  int64_t* counts;

  Map(Slot* slots_, int64_t count, int64_t capacity_, int64_t* row_keys_, int64_t* last_seen_, int64_t* counts_)
      : Probing(slots_, count), capacity(capacity_), row_keys(row_keys_), last_seen(last_seen_), counts(counts_) {}

  // The live rows that `eligible` admits, the `limit` least by `less` (which ends on the row,
  // a total order), ascending. One pass keeping the least so far in a max-heap: memory for
  // `limit` rows, not for every candidate (a full table has capacity of them).
  template <typename Eligible, typename Less>
  std::vector<int64_t> least_rows(int64_t limit, Eligible eligible, Less less) const {
    const auto wanted = static_cast<size_t>(std::max<int64_t>(std::min(limit, capacity), 0));
    std::vector<int64_t> heap;
    heap.reserve(wanted);
    if (wanted == 0) return heap;
    for (int64_t row = 0; row < capacity; ++row) {
      if (row_keys[row] == kEmptyKey || !eligible(row)) continue;
      if (heap.size() < wanted) {
        heap.push_back(row);
        std::push_heap(heap.begin(), heap.end(), less);
      } else if (less(row, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), less);
        heap.back() = row;
        std::push_heap(heap.begin(), heap.end(), less);
      }
    }
    std::sort_heap(heap.begin(), heap.end(), less);
    return heap;
  }
};

void check_int64(const torch::Tensor& t, const char* op, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kInt64 && t.dim() == dim && t.is_contiguous(), op,
              ": ", name, " must be a contiguous ", dim, "-d int64 host tensor, not ", t.scalar_type(), " of shape ",
              t.sizes(), t.is_contiguous() ? "" : " (not contiguous)");
}

Map map_of(const char* op, torch::Tensor& index, torch::Tensor& row_keys, torch::Tensor& last_seen,
           torch::Tensor& counts) {
  check_int64(index, op, "index", 2);
  check_int64(row_keys, op, "row_keys", 1);
  check_int64(last_seen, op, "last_seen", 1);
  check_int64(counts, op, "counts", 1);
  const int64_t slots = index.size(0), capacity = row_keys.numel();
  TORCH_CHECK(index.size(1) == 2, op, ": index must hold (key, row) pairs, shape (slots, 2), not ", index.sizes());
  // More slots than rows: a probe always meets an empty slot, and so ends.
  TORCH_CHECK(slots >= 2 && (slots & (slots - 1)) == 0 && slots > capacity, op,
              ": index slots must be a power of two above the capacity (", capacity, "), not ", slots);
  TORCH_CHECK(last_seen.numel() == capacity && counts.numel() == capacity, op,
              ": row_keys, last_seen and counts must have one entry per row (", capacity, ", ", last_seen.numel(),
              ", ", counts.numel(), ")");
  return Map(reinterpret_cast<Slot*>(index.data_ptr<int64_t>()), slots, capacity, row_keys.data_ptr<int64_t>(),
             last_seen.data_ptr<int64_t>(), counts.data_ptr<int64_t>());
}

// A live row's key out of the index; its absence means an index out of step with row_keys.
void erase_live(Map& map, int64_t row) {
  TORCH_CHECK(map.erase(map.row_keys[row]), "id map: key ", map.row_keys[row],
              " of a live row is not in the index (rebuild it from row_keys)");
}

// The stack of free rows: free_rows[:free_count[0]], popped from the end.
struct FreeRows {
  int32_t* rows;
  int64_t* count;

  FreeRows(const char* op, torch::Tensor& free_rows, torch::Tensor& free_count, int64_t capacity) {
    TORCH_CHECK(free_rows.device().is_cpu() && free_rows.scalar_type() == torch::kInt32 && free_rows.dim() == 1 &&
                    free_rows.is_contiguous() && free_rows.numel() == capacity,
                op, ": free_rows must be a contiguous int32 host tensor of one entry per row (", capacity,
                "), not ", free_rows.scalar_type(), " of shape ", free_rows.sizes());
    check_int64(free_count, op, "free_count", 1);
    TORCH_CHECK(free_count.numel() == 1, op, ": free_count must have shape (1,), not ", free_count.sizes());
    rows = free_rows.data_ptr<int32_t>();
    count = free_count.data_ptr<int64_t>();
    TORCH_CHECK(*count >= 0 && *count <= capacity, op, ": free_count ", *count, " outside 0..", capacity);
  }

  int64_t pop() { return rows[--*count]; }
  void push(int64_t row) { rows[(*count)++] = static_cast<int32_t>(row); }
};

torch::Tensor as_tensor(const std::vector<int64_t>& values) {
  return torch::tensor(at::ArrayRef<int64_t>(values), torch::kInt64);
}

// The row of each key or -1; with `update`, each row found gets last_seen = batch and its
// count grows by its occurrences. Also the keys not found (EMPTY_KEY aside), once each in
// order of first occurrence, their occurrences, and per position the index of its key
// among them (-1 for hits and EMPTY_KEY).
std::vector<torch::Tensor> find(torch::Tensor index, torch::Tensor row_keys, torch::Tensor last_seen,
                                torch::Tensor counts, torch::Tensor keys, int64_t batch, bool update) {
  const Map map = map_of("find", index, row_keys, last_seen, counts);
  check_int64(keys, "find", "keys", 1);
  const int64_t n = keys.numel();
  const int64_t* key = keys.data_ptr<int64_t>();
  auto rows = torch::empty({n}, keys.options());
  auto miss_inverse = torch::empty({n}, keys.options());
  int64_t* row = rows.data_ptr<int64_t>();
  int64_t* inverse = miss_inverse.data_ptr<int64_t>();
  at::parallel_for(0, n, kGrainKeys, [&](int64_t begin, int64_t end) { map.rows_of(key + begin, end - begin, row + begin); });

  // The misses, de-duplicated in a table of their own at most half full.
  const int64_t misses = std::count_if(row, row + n, [](int64_t r) { return r < 0; });
  int64_t miss_slots = 2;
  while (miss_slots < 2 * misses) miss_slots *= 2;
  std::vector<Slot> miss_table(miss_slots, Slot{kEmptyKey, -1});  // key -> its index among the misses
  Probing seen(miss_table.data(), miss_slots);
  std::vector<int64_t> miss_keys, miss_counts;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = row[i];
    inverse[i] = -1;
    if (r >= 0) {
      if (!update) continue;
      // Rows are scattered over the map: fetch the counters of a row a few keys ahead.
      if (i + kPrefetchDistance < n && row[i + kPrefetchDistance] >= 0) {
        __builtin_prefetch(map.last_seen + row[i + kPrefetchDistance], 1);
        __builtin_prefetch(map.counts + row[i + kPrefetchDistance], 1);
      }
      TORCH_CHECK(r < map.capacity, "find: the index maps key ", key[i], " to row ", r, " outside the ",
                  map.capacity, " rows");
      map.last_seen[r] = batch;
      map.counts[r] += 1;
    } else if (key[i] != kEmptyKey) {
      int64_t slot = seen.slot_of(key[i], seen.home(key[i]));
      if (slot < 0) {
        slot = seen.insert(key[i], static_cast<int64_t>(miss_keys.size()));
        miss_keys.push_back(key[i]);
        miss_counts.push_back(0);
      }
      inverse[i] = miss_table[slot].row;
      miss_counts[inverse[i]] += 1;
    }
  }
  return {rows, as_tensor(miss_keys), as_tensor(miss_counts), miss_inverse};
}

// Rows for new keys, in order: a free row while there is one; else, with `lfu`, the row of
// the live key with the fewest counts (then the oldest last_seen, then the lowest row)
// among rows last seen before protect_since; else -1. Returns the rows, and the keys and
// rows evicted for them.
std::vector<torch::Tensor> admit(torch::Tensor index, torch::Tensor row_keys, torch::Tensor last_seen,
                                 torch::Tensor counts, torch::Tensor free_rows, torch::Tensor free_count,
                                 torch::Tensor keys, torch::Tensor key_counts, int64_t batch, bool lfu,
                                 int64_t protect_since) {
  Map map = map_of("admit", index, row_keys, last_seen, counts);
  FreeRows free("admit", free_rows, free_count, map.capacity);
  check_int64(keys, "admit", "keys", 1);
  check_int64(key_counts, "admit", "key_counts", 1);
  const int64_t n = keys.numel();
  TORCH_CHECK(key_counts.numel() == n, "admit: one count per key (", n, " keys, ", key_counts.numel(), " counts)");
  const int64_t* key = keys.data_ptr<int64_t>();
  const int64_t* key_count = key_counts.data_ptr<int64_t>();
  // EMPTY_KEY marks empty slots: admitted, it would hold a row that no op can find or free.
  TORCH_CHECK(std::find(key, key + n, kEmptyKey) == key + n,
              "admit: EMPTY_KEY (-2^63) is never admitted: its ids take the field's default row");

  std::vector<int64_t> victims;
  if (lfu && n > *free.count) {
    victims = map.least_rows(
        n - *free.count, [&](int64_t r) { return map.last_seen[r] < protect_since; },
        [&](int64_t a, int64_t b) {
          return std::tie(map.counts[a], map.last_seen[a], a) < std::tie(map.counts[b], map.last_seen[b], b);
        });
  }
  auto rows = torch::full({n}, -1, keys.options());
  int64_t* row_of = rows.data_ptr<int64_t>();
  std::vector<int64_t> evicted_keys, evicted_rows;
  size_t next_victim = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t row;
    if (*free.count) {
      row = free.pop();
    } else if (next_victim < victims.size()) {
      row = victims[next_victim++];
      evicted_keys.push_back(map.row_keys[row]);
      evicted_rows.push_back(row);
      erase_live(map, row);
    } else {
      continue;  // refused
    }
    map.insert(key[i], row);
    map.row_keys[row] = key[i];
    map.last_seen[row] = batch;
    map.counts[row] = key_count[i];
    row_of[i] = row;
  }
  return {rows, as_tensor(evicted_keys), as_tensor(evicted_rows)};
}

// Free every row last seen before older_than, oldest first (by last_seen, then row), but
// never so many that fewer than `keep` rows stay live. Returns their keys and rows.
std::vector<torch::Tensor> expire(torch::Tensor index, torch::Tensor row_keys, torch::Tensor last_seen,
                                  torch::Tensor counts, torch::Tensor free_rows, torch::Tensor free_count,
                                  int64_t older_than, int64_t keep) {
  Map map = map_of("expire", index, row_keys, last_seen, counts);
  FreeRows free("expire", free_rows, free_count, map.capacity);
  const int64_t live = map.capacity - *free.count;
  const std::vector<int64_t> expired = map.least_rows(
      live - keep, [&](int64_t r) { return map.last_seen[r] < older_than; },
      [&](int64_t a, int64_t b) { return std::tie(map.last_seen[a], a) < std::tie(map.last_seen[b], b); });
  std::vector<int64_t> evicted_keys;
  evicted_keys.reserve(expired.size());
  for (int64_t row : expired) {
    evicted_keys.push_back(map.row_keys[row]);
    erase_live(map, row);
    map.row_keys[row] = kEmptyKey;
    map.last_seen[row] = -1;
    map.counts[row] = 0;
    free.push(row);
  }
  return {as_tensor(evicted_keys), as_tensor(expired)};
}

// One training batch of one field, all of dynamic_rows.DynamicField.resolve in one call
// (the reference is id_map_reference.resolve): expire (with expire_rows), find and stamp,
// count the misses in the admission sketch (when it has counters), admit the keys it lets
// in, then each key's row (the field's default row for a key with none, EMPTY_KEY's
// included) and, per key given a row, where it first occurs and its key. Returns those
// and the counts DynamicStats keeps after lookups: hits, admitted, evicted by age,
// evicted when full, refused, default lookups. The sketch is hot_cache's (compiled before
// this source in picasso_kernels.cpp): sketch_added counts the occurrences added since
// the counts last halved, which they do once it reaches sketch_window.
std::vector<torch::Tensor> resolve(torch::Tensor index, torch::Tensor row_keys, torch::Tensor last_seen,
                                   torch::Tensor counts, torch::Tensor free_rows, torch::Tensor free_count,
                                   torch::Tensor keys, int64_t now, bool expire_rows, int64_t older_than, int64_t keep,
                                   bool lfu, int64_t protect_since, int64_t default_row, torch::Tensor sketch_counters,
                                   torch::Tensor sketch_multipliers, int64_t sketch_bits, torch::Tensor sketch_added,
                                   int64_t sketch_window, double admit_after) {
  enum { kHits, kAdmitted, kEvictedByAge, kEvictedWhenFull, kRefused, kDefaultLookups, kStats };
  auto stats = torch::zeros({kStats}, torch::kInt64);
  int64_t* stat = stats.data_ptr<int64_t>();
  if (expire_rows)
    stat[kEvictedByAge] = expire(index, row_keys, last_seen, counts, free_rows, free_count, older_than, keep)[1].numel();
  const std::vector<torch::Tensor> found = find(index, row_keys, last_seen, counts, keys, now, true);
  const torch::Tensor& rows = found[0];
  const torch::Tensor &miss_keys = found[1], &miss_counts = found[2];
  const int64_t n = keys.numel(), misses = miss_keys.numel();
  int64_t* row = rows.data_ptr<int64_t>();
  const int64_t* inverse = found[3].data_ptr<int64_t>();
  const int64_t* miss_key = miss_keys.data_ptr<int64_t>();
  stat[kHits] = std::count_if(row, row + n, [](int64_t r) { return r >= 0; });

  // Which misses are let in: all, or those the sketch has now counted admit_after times.
  std::vector<char> chosen(misses, 1);
  if (sketch_counters.numel() && misses) {
    check_int64(sketch_added, "resolve", "sketch_added", 0);
    const torch::Tensor estimates =
        hot_cache::sketch_add(sketch_counters, miss_keys, miss_counts, sketch_multipliers, sketch_bits);
    const float* estimate = estimates.data_ptr<float>();
    for (int64_t j = 0; j < misses; ++j) chosen[j] = estimate[j] >= admit_after;
    int64_t& added = *sketch_added.data_ptr<int64_t>();
    added += miss_counts.sum().item<int64_t>();
    if (added >= sketch_window) {  // TinyLFU's reset: ids seen long ago fade
      sketch_counters.mul_(0.5);
      added = 0;
    }
  }
  std::vector<int64_t> admit_keys, admit_counts;
  const int64_t* miss_count = miss_counts.data_ptr<int64_t>();
  for (int64_t j = 0; j < misses; ++j) {
    if (!chosen[j]) continue;
    admit_keys.push_back(miss_key[j]);
    admit_counts.push_back(miss_count[j]);
  }
  std::vector<int64_t> row_of_miss(misses, -1);
  if (!admit_keys.empty()) {
    const std::vector<torch::Tensor> admitted = admit(index, row_keys, last_seen, counts, free_rows, free_count,
                                                      as_tensor(admit_keys), as_tensor(admit_counts), now, lfu,
                                                      protect_since);
    const int64_t* new_row = admitted[0].data_ptr<int64_t>();
    stat[kEvictedWhenFull] = admitted[2].numel();
    for (int64_t j = 0, k = 0; j < misses; ++j) {
      if (!chosen[j]) continue;
      row_of_miss[j] = new_row[k++];
      stat[kRefused] += row_of_miss[j] < 0;
    }
  }
  // Each miss's row, where each miss first occurs, then the default row for the rest.
  std::vector<int64_t> first(misses, n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = inverse[i];
    if (j < 0) continue;
    row[i] = row_of_miss[j];
    if (first[j] == n) first[j] = i;
  }
  std::vector<int64_t> new_positions, new_keys;
  for (int64_t j = 0; j < misses; ++j) {
    if (row_of_miss[j] < 0) continue;
    new_positions.push_back(first[j]);
    new_keys.push_back(miss_key[j]);
  }
  stat[kAdmitted] = static_cast<int64_t>(new_keys.size());
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] >= 0) continue;
    row[i] = default_row;
    ++stat[kDefaultLookups];
  }
  return {rows, as_tensor(new_positions), as_tensor(new_keys), stats};
}

// Column c of key k's first values, as id_map_reference.initial_rows: the top 24 bits of
// mix(k * (width + 1) + c + 1), in double, rounded once.
inline float initial_value(int64_t key, int64_t c, uint64_t stride, double scale) {
  const uint64_t x = static_cast<uint64_t>(key) * stride + static_cast<uint64_t>(c + 1);
  const double unit = static_cast<double>(mix(static_cast<int64_t>(x)) >> 40) / 16777216.0;
  return static_cast<float>((2.0 * unit - 1.0) * scale);
}

// The first values of the rows new keys take.
torch::Tensor initial_rows(torch::Tensor keys, int64_t width, double scale) {
  check_int64(keys, "initial_rows", "keys", 1);
  TORCH_CHECK(width >= 1, "initial_rows: width must be >= 1, got ", width);
  const int64_t n = keys.numel();
  torch::Tensor out = torch::empty({n, width}, torch::kFloat32);
  const int64_t* key = keys.data_ptr<int64_t>();
  float* value = out.data_ptr<float>();
  const uint64_t stride = static_cast<uint64_t>(width) + 1;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < width; ++c) value[i * width + c] = initial_value(key[i], c, stride, scale);
  return out;
}

// Rows `targets` of `weight` take keys' first values (zeros when scale is 0, as a wide
// part's), and the same rows of every slot tensor (one value per row, or a row as wide
// as the weight's) are zeroed: id_map_reference.reset_rows in place, with no values
// tensor and no index_put per tensor. A step's new rows are few and scattered, so this
// runs on one thread.
void reset_rows(torch::Tensor weight, std::vector<torch::Tensor> slots, torch::Tensor targets, torch::Tensor keys,
                double scale) {
  check_int64(keys, "reset_rows", "keys", 1);
  check_int64(targets, "reset_rows", "targets", 1);
  TORCH_CHECK(targets.numel() == keys.numel(), "reset_rows: one target per key (", targets.numel(), " targets, ",
              keys.numel(), " keys)");
  auto check_rows = [&](const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.dim() >= 1 &&
                    t.dim() <= 2,
                "reset_rows: ", name, " must be a contiguous float32 host tensor of rows, not ", t.scalar_type(),
                " of shape ", t.sizes());
  };
  check_rows(weight, "weight");
  TORCH_CHECK(weight.dim() == 2, "reset_rows: weight must be (rows, width), not ", weight.sizes());
  for (const auto& slot : slots) {
    check_rows(slot, "a slot");
    TORCH_CHECK(slot.size(0) == weight.size(0), "reset_rows: a slot has ", slot.size(0), " rows, the weight ",
                weight.size(0));
  }
  const int64_t n = keys.numel(), width = weight.size(1), rows = weight.size(0);
  const int64_t* key = keys.data_ptr<int64_t>();
  const int64_t* target = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(target[i] >= 0 && target[i] < rows, "reset_rows: target ", target[i], " outside the ", rows, " rows");
  float* w = weight.data_ptr<float>();
  const uint64_t stride = static_cast<uint64_t>(width) + 1;
  for (int64_t i = 0; i < n; ++i) {
    float* row = w + target[i] * width;
    for (int64_t c = 0; c < width; ++c) row[c] = scale == 0.0 ? 0.0f : initial_value(key[i], c, stride, scale);
  }
  for (auto& slot : slots) {
    const int64_t slot_width = slot.numel() / rows;
    float* s = slot.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) std::fill(s + target[i] * slot_width, s + (target[i] + 1) * slot_width, 0.0f);
  }
}

// The index again from row_keys, inserting the live rows in order.
void rebuild(torch::Tensor index, torch::Tensor row_keys) {
  // map_of's checks, with row_keys standing in for the counters rebuild never reads.
  Map map = map_of("rebuild", index, row_keys, row_keys, row_keys);
  std::fill(map.slots, map.slots + map.mask + 1, Slot{kEmptyKey, -1});
  for (int64_t row = 0; row < map.capacity; ++row)
    if (map.row_keys[row] != kEmptyKey) map.insert(map.row_keys[row], row);
}

}  // namespace

// The kernels release the GIL: a step computing in one thread and the next batch being
// prepared in another then run side by side.
void register_ops(py::module_ m) {
  m.def("find", &find, "the rows of a batch of keys, and its misses", py::call_guard<py::gil_scoped_release>());
  m.def("admit", &admit, "rows for new keys: free rows, then LFU victims", py::call_guard<py::gil_scoped_release>());
  m.def("expire", &expire, "free the rows last seen before a batch", py::call_guard<py::gil_scoped_release>());
  m.def("resolve", &resolve, "one training batch of one field: expire, find, count, admit, first occurrences",
        py::call_guard<py::gil_scoped_release>());
  m.def("rebuild", &rebuild, "the index again from row_keys", py::call_guard<py::gil_scoped_release>());
  m.def("initial_rows", &initial_rows, "the first values of new keys' rows", py::call_guard<py::gil_scoped_release>());
  m.def("reset_rows", &reset_rows, "new keys' first values and zeroed slots, in place",
        py::call_guard<py::gil_scoped_release>());
}

}  // namespace picasso_kernels::id_map
