// Small SIMD helpers for the CPU kernels: 16-lane float vectors (GCC/Clang vector extensions,
// compiled for this machine's widest units), loads from float32 or bfloat16 (its bits, uint16:
// how the CPU platform stores a bfloat16 KV cache), a lane-wise exp and a page prefetch.
#pragma once

#include <cstdint>
#include <cstring>

namespace jaxvllm {

constexpr int64_t kLanes = 16;
typedef float F16 __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t I16 __attribute__((vector_size(kLanes * sizeof(int32_t))));

typedef uint16_t U16 __attribute__((vector_size(kLanes * sizeof(uint16_t))));

inline F16 Load(const float* p) { F16 v; std::memcpy(&v, p, sizeof(v)); return v; }
// bfloat16 is float32's top half: widening is a shift, exact.
inline F16 Load(const uint16_t* p) {
  U16 h;
  std::memcpy(&h, p, sizeof(h));
  const I16 bits = __builtin_convertvector(h, I16) << 16;
  F16 v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}
inline float ToFloat(float x) { return x; }
inline float ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}
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

// tanh as Eigen's rational approximation (the one XLA's CPU tanh uses), on vectors: libm's
// tanh does not vectorize, and with it Gemma 2's soft-capped scores made its decode step 1.4x
// Llama's at the same shape. Beyond +-9 tanh is +-1 in float32.
inline F16 Tanh(F16 x) {
  x = x < -9.0f ? F16{} - 9.0f : x;
  x = x > 9.0f ? F16{} + 9.0f : x;
  const F16 x2 = x * x;
  F16 p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  F16 q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return x * p / q;
}

// Gemma 2's cap on attention scores: cap * tanh(x / cap); cap <= 0 is none.
inline F16 SoftCap(F16 x, float cap) { return cap > 0.0f ? Tanh(x / cap) * cap : x; }

// Lane j of the result is the sum of v[j]'s lanes: 16 horizontal sums in 15 adds of halves
// exchanged between vectors, instead of a reduction tree per vector.
inline F16 HorizontalSums(const F16 (&v)[kLanes]) {
  F16 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i)
    w[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    x[i] = __builtin_shufflevector(w[2 * i], w[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           __builtin_shufflevector(w[2 * i], w[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    y[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  const F16 z = __builtin_shufflevector(y[0], y[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
                __builtin_shufflevector(y[0], y[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  // z holds v[j]'s sum in lane bitreverse(j) (4 bits), and bit reversal is its own inverse.
  return __builtin_shufflevector(z, z, 0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15);
}

// A sequence's next page lies anywhere in the cache: start fetching its K and V early, into
// L2 (locality 1). With prefetches into L1 a 64 x 512 decode read its KV at 18 GB/s; with
// these, at 28 GB/s (a plain streaming read of the cache: 33 GB/s).
template <typename T>
inline void PrefetchPage(const T* k, int64_t v_offset, int64_t elements) {
  for (int64_t b = 0; b < elements; b += 64 / sizeof(T)) {  // one per cache line
    __builtin_prefetch(k + b, 0, 1);
    __builtin_prefetch(k + v_offset + b, 0, 1);
  }
}

}  // namespace jaxvllm
