// Small SIMD helpers for the CPU kernels: 16-lane float vectors (GCC/Clang vector extensions,
// compiled for this machine's widest units), a lane-wise exp and a page prefetch.
#pragma once

#include <cstdint>
#include <cstring>

namespace jaxvllm {

constexpr int64_t kLanes = 16;
typedef float F16 __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t I16 __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline F16 Load(const float* p) { F16 v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void Store(float* p, F16 v) { std::memcpy(p, &v, sizeof(v)); }
inline float Sum(F16 v) { float s = 0.0f; for (int64_t i = 0; i < kLanes; ++i) s += v[i]; return s; }

// exp in plain arithmetic (Cephes' expf polynomial, relative error about 1e-7), written on
// vectors because compilers do not vectorize libm's exp. Below -87 it is exactly 0, so masked
// scores (a large negative value) vanish.
inline F16 Exp(F16 x) {
  const F16 zero = {}, n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round
  const F16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  F16 y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  I16 bits = (__builtin_convertvector(x < -87.0f ? zero : n, I16) + 127) << 23;
  F16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.0f ? zero : y * scale;
}

inline float Exp(float x) { return Exp(F16{} + x)[0]; }

// A sequence's next page lies anywhere in the cache: start fetching its K and V early.
inline void PrefetchPage(const float* k, int64_t v_offset, int64_t floats) {
  for (int64_t b = 0; b < floats; b += kLanes) {
    __builtin_prefetch(k + b);
    __builtin_prefetch(k + v_offset + b);
  }
}

}  // namespace jaxvllm
