/* rng.c — seeded random streams: splitmix64 (seeding, hashing) and xoshiro256** (streams).
 *
 * No state beyond the caller's wagma_rng_t; no threads. Invariant: every value is a pure
 * function of the seed and the number of draws, on every platform (no libc rand, no floats in
 * the integer paths), which is what makes training deterministic for a seed. */
#include <math.h>

#include "agent/train/train.h"

uint64_t wagma_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void wagma_rng_seed(wagma_rng_t *rng, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    rng->s[i] = z ^ (z >> 31);
  }
}

static inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t wagma_rng_next(wagma_rng_t *rng) {
  uint64_t *s = rng->s;
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

uint64_t wagma_rng_below(wagma_rng_t *rng, uint64_t bound) {
  if (bound <= 1)
    return 0;
  /* Rejection from the top of the range: unbiased, expected < 2 draws. */
  uint64_t limit = UINT64_MAX - (UINT64_MAX % bound);
  uint64_t r;
  do
    r = wagma_rng_next(rng);
  while (r >= limit);
  return r % bound;
}

double wagma_rng_uniform(wagma_rng_t *rng) {
  return (double)(wagma_rng_next(rng) >> 11) * 0x1.0p-53;
}

double wagma_rng_normal(wagma_rng_t *rng) {
  double u1 = 1.0 - wagma_rng_uniform(rng); /* (0, 1]: log is finite */
  double u2 = wagma_rng_uniform(rng);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t wagma_seed_derive(uint64_t seed, const char *label) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the label, then mixed with the seed */
  if (label)
    for (const unsigned char *p = (const unsigned char *)label; *p; p++)
      h = (h ^ *p) * 0x100000001b3ull;
  return wagma_mix64(wagma_mix64(seed) ^ h);
}
