// tdbg kernel prelude: scalar helpers every generated kernel may use.
// Kept light on purpose (no ATen): it is parsed once per kernel translation unit.
#pragma once
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <limits>
#include <type_traits>
#include <omp.h>

template <typename T> inline bool tdbg_isnan(T a) {
  if constexpr (std::is_floating_point_v<T>) { return std::isnan(a); } else { return false; }
}

// NaN-propagating max/min (torch.maximum / torch.minimum semantics).
template <typename T> inline T tdbg_maximum(T a, T b) {
  if (tdbg_isnan(a)) return a;
  if (tdbg_isnan(b)) return b;
  return a > b ? a : b;
}
template <typename T> inline T tdbg_minimum(T a, T b) {
  if (tdbg_isnan(a)) return a;
  if (tdbg_isnan(b)) return b;
  return a < b ? a : b;
}

template <typename T> inline T tdbg_abs(T a) {
  if constexpr (std::is_same_v<T, bool> || std::is_unsigned_v<T>) { return a; }
  else if constexpr (std::is_floating_point_v<T>) { return std::abs(a); }
  else { return static_cast<T>(a < 0 ? -a : a); }
}

template <typename T> inline T tdbg_relu(T a) { return a < T(0) ? T(0) : a; }

template <typename T> inline T tdbg_sign(T a) {
  if constexpr (std::is_same_v<T, bool>) { return a; }
  else { return static_cast<T>((T(0) < a) - (a < T(0))); }  // sign(NaN) == 0 as in torch
}

template <typename T> inline T tdbg_sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }
template <typename T> inline T tdbg_rsqrt(T a) { return T(1) / std::sqrt(a); }
template <typename T> inline T tdbg_reciprocal(T a) { return T(1) / a; }
template <typename T> inline T tdbg_frac(T a) { return a - std::trunc(a); }
template <typename T> inline T tdbg_round(T a) {
  if constexpr (std::is_floating_point_v<T>) { return std::nearbyint(a); } else { return a; }
}
template <typename T> inline T tdbg_floor(T a) {
  if constexpr (std::is_floating_point_v<T>) { return std::floor(a); } else { return a; }
}
template <typename T> inline T tdbg_ceil(T a) {
  if constexpr (std::is_floating_point_v<T>) { return std::ceil(a); } else { return a; }
}
template <typename T> inline T tdbg_trunc(T a) {
  if constexpr (std::is_floating_point_v<T>) { return std::trunc(a); } else { return a; }
}

// Python-style floor division and remainder (torch.floor_divide / torch.remainder).
template <typename T> inline T tdbg_floordiv(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (b == 0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    if (div == 0) return std::copysign(T(0), a / b);
    T floordiv = std::floor(div);
    if (div - floordiv > T(0.5)) floordiv += T(1);
    return floordiv;
  } else if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>) {
    return static_cast<T>(a / b);
  } else {
    T q = static_cast<T>(a / b);
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
  }
}
template <typename T> inline T tdbg_remainder(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    T mod = std::fmod(a, b);
    if (mod != 0 && ((b < 0) != (mod < 0))) mod += b;
    return mod;
  } else if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>) {
    return static_cast<T>(a % b);
  } else {
    T r = static_cast<T>(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  }
}
template <typename T> inline T tdbg_fmod(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) { return std::fmod(a, b); }
  else { return static_cast<T>(a % b); }
}
template <typename T> inline T tdbg_truncdiv(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) { return std::trunc(a / b); }
  else { return static_cast<T>(a / b); }
}

template <typename T> inline T tdbg_pow(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) { return std::pow(a, b); }
  else if constexpr (std::is_same_v<T, bool>) { return a || !b; }
  else {
    if (b < 0) { return static_cast<T>(a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0)); }
    T result = 1;
    while (b) { if (b & 1) result = static_cast<T>(result * a); b >>= 1; a = static_cast<T>(a * a); }
    return result;
  }
}

template <typename T> inline T tdbg_shl(T a, T b) {
  using U = std::make_unsigned_t<T>;
  if (b < 0 || b >= T(sizeof(T) * 8)) return 0;
  return static_cast<T>(static_cast<U>(a) << b);
}
template <typename T> inline T tdbg_shr(T a, T b) {
  if (b < 0 || b >= T(sizeof(T) * 8)) return std::is_signed_v<T> && a < 0 ? T(-1) : T(0);
  return static_cast<T>(a >> b);
}

// argmax/argmin update: strict comparison keeps the first index; NaN wins and stays.
template <typename T> inline bool tdbg_arg_better_max(T cand, T acc) {
  if (tdbg_isnan(acc)) return false;
  if (tdbg_isnan(cand)) return true;
  return cand > acc;
}
template <typename T> inline bool tdbg_arg_better_min(T cand, T acc) {
  if (tdbg_isnan(acc)) return false;
  if (tdbg_isnan(cand)) return true;
  return cand < acc;
}
