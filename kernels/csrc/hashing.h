// The pieces of picasso/hashing.py that more than one kernel computes, bit for bit:
// decode_ids.cpp hashes raw ids with them, cross_ids.cpp a cross's keys.
//
// A header rather than a source of its own: picasso_kernels.cpp compiles the sources as
// one unit, and each source includes what it uses, so that it reads on its own.

#pragma once

#include <cstdint>

namespace picasso_kernels {

// hashing.splitmix64: the finaliser every id hash is made of.
inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// h % d without a division (Lemire, Kaser and Kurz, "Faster remainder by direct
// computation", 2019): exact for every 64-bit h and d, with M = ceil(2^128 / d). A 64-bit
// division takes 40 to 90 cycles on many x86 cores, more than hashing a short id.
struct FastMod {
  unsigned __int128 m;
  uint64_t d;

  explicit FastMod(uint64_t divisor) : m(~static_cast<unsigned __int128>(0) / (divisor ? divisor : 1) + 1), d(divisor) {}

  uint64_t operator()(uint64_t h) const {
    const unsigned __int128 low = m * h;  // modulo 2^128
    const unsigned __int128 bottom = static_cast<unsigned __int128>(static_cast<uint64_t>(low)) * d;
    const unsigned __int128 top = (low >> 64) * d;
    return static_cast<uint64_t>((top + (bottom >> 64)) >> 64);
  }
};

}  // namespace picasso_kernels
