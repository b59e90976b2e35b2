// tdbg kernel prelude: scalar helpers every generated kernel may use (#include "tdbg_prelude.h").
//
// Parsed once per kernel translation unit, so it includes no heavy C++ standard header (<cmath>
// alone costs g++ ~0.4 s per kernel): types, limits and libm calls come from GCC builtins and
// predefined macros. tests/compiler/test_vecmath.py pins the include list.
//
// float32 math (exp, expm1, exp2, log, log1p, log2, erf, tanh, sigmoid) is written branch-free
// (selects, bit casts, no loops or early returns) and always inlined, so loops calling it
// vectorize under `#pragma omp simd`; NaN/inf/overflow/underflow follow torch. Polynomials are
// near-minimax fits (Lawson iteration against mpmath); the measured errors are in README
// "Vectorized float math". double and integer operands call libm (exact as in eager).
#pragma once
// Generated code spells no std:: name: tdbg_limits<T>::infinity() / lowest() / max() /
// quiet_NaN(), tdbg_min / tdbg_max, tdbg_exp, ...
#include <omp.h>   // tiny C header: omp_* calls stay available to generated code

typedef __INT8_TYPE__ int8_t;
typedef __INT16_TYPE__ int16_t;
typedef __INT32_TYPE__ int32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __UINT64_TYPE__ uint64_t;
typedef __UINTPTR_TYPE__ uintptr_t;
typedef __INTPTR_TYPE__ intptr_t;

#define TDBG_INLINE inline __attribute__((always_inline))

// ---- type traits and limits (what <type_traits> / <limits> would give) ------------------------
template <class T> constexpr bool tdbg_is_float = false;
template <> constexpr bool tdbg_is_float<float> = true;
template <> constexpr bool tdbg_is_float<double> = true;
template <class T> constexpr bool tdbg_is_bool = false;
template <> constexpr bool tdbg_is_bool<bool> = true;
template <class T> constexpr bool tdbg_is_unsigned = !tdbg_is_float<T> && T(0) < T(-1);

template <class T> struct tdbg_unsigned { typedef T type; };
template <> struct tdbg_unsigned<int8_t> { typedef uint8_t type; };
template <> struct tdbg_unsigned<int16_t> { typedef uint16_t type; };
template <> struct tdbg_unsigned<int32_t> { typedef uint32_t type; };
template <> struct tdbg_unsigned<int64_t> { typedef uint64_t type; };

// tdbg_limits<T> has numeric_limits' member names: spell `tdbg_limits<T>::infinity()`.
template <class T> struct tdbg_limits;
#define TDBG_LIMITS(T, LO, HI, INF, NAN_)                                                   \
  template <> struct tdbg_limits<T> {                                                        \
    static constexpr T lowest() { return LO; }                                               \
    static constexpr T max() { return HI; }                                                  \
    static constexpr T infinity() { return INF; }                                            \
    static constexpr T quiet_NaN() { return NAN_; }                                          \
  };
TDBG_LIMITS(bool, false, true, false, false)
TDBG_LIMITS(int8_t, -__INT8_MAX__ - 1, __INT8_MAX__, 0, 0)
TDBG_LIMITS(int16_t, -__INT16_MAX__ - 1, __INT16_MAX__, 0, 0)
TDBG_LIMITS(int32_t, -__INT32_MAX__ - 1, __INT32_MAX__, 0, 0)
TDBG_LIMITS(int64_t, -__INT64_MAX__ - 1, __INT64_MAX__, 0, 0)
TDBG_LIMITS(uint8_t, 0, __UINT8_MAX__, 0, 0)
TDBG_LIMITS(uint16_t, 0, __UINT16_MAX__, 0, 0)
TDBG_LIMITS(uint32_t, 0, __UINT32_MAX__, 0, 0)
TDBG_LIMITS(uint64_t, 0, __UINT64_MAX__, 0, 0)
TDBG_LIMITS(float, -__FLT_MAX__, __FLT_MAX__, __builtin_inff(), __builtin_nanf(""))
TDBG_LIMITS(double, -__DBL_MAX__, __DBL_MAX__, __builtin_inf(), __builtin_nan(""))
#undef TDBG_LIMITS

template <class T> TDBG_INLINE T tdbg_min(T a, T b) { return b < a ? b : a; }
template <class T> TDBG_INLINE T tdbg_max(T a, T b) { return a < b ? b : a; }

// ---- float32 building blocks ------------------------------------------------------------------
namespace tdbg_detail {
constexpr float kInf = __builtin_inff();
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;        // 16 significant bits: k * kLn2Hi is exact
constexpr float kLn2Lo = 1.42860682030941723e-06f;  // ln 2 - kLn2Hi
constexpr float kRound = 12582912.0f;                // 1.5 * 2^23: (x + kRound) - kRound rounds

TDBG_INLINE uint32_t bits(float x) { return __builtin_bit_cast(uint32_t, x); }
TDBG_INLINE float from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }
constexpr float kNaN = __builtin_nanf("");
TDBG_INLINE bool isnan(float x) { return x != x; }
// quiet comparisons: an ordered `<` may raise FE_INVALID, so g++ will not if-convert it when
// it ends up in a conditional block
TDBG_INLINE bool lt(float a, float b) { return __builtin_isless(a, b); }
TDBG_INLINE bool gt(float a, float b) { return __builtin_isgreater(a, b); }
TDBG_INLINE bool ge(float a, float b) { return __builtin_isgreaterequal(a, b); }
// c ? a : b as a bit blend. g++ turns a select whose arm is computed only for it into a branch
// and then refuses to if-convert it under -ftrapping-math ("tree could trap"): the loop stays
// scalar. A blend keeps both arms live.
TDBG_INLINE float sel(bool c, float a, float b) {
  uint32_t m = -static_cast<uint32_t>(c);
  return from_bits((bits(a) & m) | (bits(b) & ~m));
}
TDBG_INLINE double sel(bool c, double a, double b) {
  uint64_t m = -static_cast<uint64_t>(c);
  return __builtin_bit_cast(double, (__builtin_bit_cast(uint64_t, a) & m) | (__builtin_bit_cast(uint64_t, b) & ~m));
}
// lo <= x <= hi, NaN -> hi. Blends, not ternaries: with a constant arm g++ specialises all the
// code that follows for that arm (masked duplicates of the whole polynomial).
TDBG_INLINE float clamp(float x, float lo, float hi) { return sel(lt(x, hi), sel(gt(x, lo), x, lo), hi); }
// -0 (adding it is the identity, -0 included), or NaN when c: `y + nan_if(isnan(x))` propagates
// NaN without a select that kills y.
TDBG_INLINE float nan_if(bool c) { return sel(c, kNaN, -0.0f); }
TDBG_INLINE float copysign(float mag, float sgn) { return __builtin_copysignf(mag, sgn); }
#ifdef __FMA__
TDBG_INLINE float mla(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#else
TDBG_INLINE float mla(float a, float b, float c) { return a * b + c; }
#endif
// Horner's scheme, coefficients from the highest power down (unrolled at compile time).
TDBG_INLINE float horner(float, float c) { return c; }
template <class... C> TDBG_INLINE float horner(float x, float hi, float next, C... rest) {
  return horner(x, mla(hi, x, next), rest...);
}

// y 2^n for n in [-252, 254] as the product of two normal powers of two (subnormal results
// round once). The biased exponents e1 + e2 = n + 254 are split in halves, both in [1, 254].
TDBG_INLINE float scale(float y, int32_t n) {
  int32_t e = n + 254;
  int32_t e1 = e >> 1;  // arithmetic shift (g++ defines it for negative values)
  return y * from_bits(static_cast<uint32_t>(e1) << 23) * from_bits(static_cast<uint32_t>(e - e1) << 23);
}

// x = k ln2 + r with |r| <= ln2/2 (Cody-Waite); x must be finite with |x| < 2^22.
struct Reduced { float k; float r; };
TDBG_INLINE Reduced reduce_ln2(float x) {
  float k = mla(x, kLog2e, kRound) - kRound;
  return {k, mla(-k, kLn2Lo, mla(-k, kLn2Hi, x))};
}

// e^r over |r| <= ln2/2 as 1 + r (1 + r P(r)); P's relative error below 3.1e-9.
TDBG_INLINE float exp_small(float r) {
  float p = horner(r, 1.38146128e-03f, 8.36871006e-03f, 4.16683890e-02f, 1.66665211e-01f, 4.99999940e-01f);
  return mla(r, mla(r, p, 1.0f), 1.0f);
}

// expm1(r) over |r| <= ln2/2 as r + r^2/2 + r^3 P(r); relative error below 4e-10.
TDBG_INLINE float expm1_small(float r) {
  float p = horner(r, 1.98241294e-04f, 1.39332446e-03f, 8.33341945e-03f, 4.16664816e-02f, 1.66666657e-01f);
  float r2 = r * r;
  return r + mla(r2, 0.5f, r2 * r * p);
}

// x = 2^k m with m in [sqrt(1/2), sqrt(2)); x positive and finite (subnormals included).
struct Split { float k; float m; };
TDBG_INLINE Split split_exponent(float x) {
  // subnormals are scaled by 2^23 first
  uint32_t sub = -static_cast<uint32_t>(lt(x, 0x1p-126f));
  uint32_t xb = bits(sel(sub != 0, x * 0x1p23f, x));
  uint32_t ix = xb - 0x3f3504f3u;
  float k = static_cast<float>((static_cast<int32_t>(ix) >> 23) - static_cast<int32_t>(sub & 23u));
  return {k, from_bits((ix & 0x007fffffu) + 0x3f3504f3u)};
}

// log(m) for m in [sqrt(1/2), sqrt(2)): log(1+f) = f - f^2/2 + s (f^2/2 + R(s^2)), s = f/(2+f).
// Returns the two parts hi + lo so callers can add k ln2 without losing the low bits.
TDBG_INLINE float log_mantissa(float m, float k_ln2_lo) {
  float f = m - 1.0f;
  float s = f / (2.0f + f);
  float z = s * s;
  float R = z * horner(z, 2.98709363e-01f, 3.99775743e-01f, 6.66667759e-01f);
  float hfsq = 0.5f * f * f;
  return f - (hfsq - mla(s, hfsq + R, k_ln2_lo));
}

// log's result: y for 0 < x < inf, else -inf for +-0 and x * inf + inf for the rest (inf for
// inf; NaN for NaN, -inf and negative x): three compares and two blends
TDBG_INLINE float log_special(float x, float y) {
  float special = sel(x == 0.0f, -kInf, mla(x, kInf, kInf));
  return sel(gt(x, 0.0f) & lt(x, kInf), y, special);
}

// erfc(x) e^{x^2} on [0.9, 4] as a polynomial in x - 2.45 (absolute error of erf below 5e-9).
TDBG_INLINE float erfc_scaled(float x) {
  float t = x - 2.45f;
  return horner(t, 1.34691334e-04f, 3.21538828e-04f, 7.20579410e-04f, -6.56798831e-04f, 2.43883464e-03f,
                -8.71271174e-03f, 2.61341836e-02f, -7.68957809e-02f, 2.14589059e-01f);
}
}  // namespace tdbg_detail

namespace tdbg_detail {
// e^x for x in [-104, 89] or NaN: e^89 overflows and e^-104 underflows to 0 on their own. A NaN
// reaches the polynomial, and whatever integer its bits give k, NaN times 2^k is NaN.
TDBG_INLINE float exp_reduced(float x) {
  float t = mla(x, kLog2e, kRound);
  float k = t - kRound;
  float r = mla(-k, kLn2Lo, mla(-k, kLn2Hi, x));
  return scale(exp_small(r), static_cast<int32_t>(bits(t) - bits(kRound)));   // bits, not a conversion: defined for NaN
}

// e^x where the result is normal and x is not NaN (erf's -x^2 >= -16, tanh's 2|x| <= 20): one
// exponent add instead of scale()'s two products
TDBG_INLINE float exp_normal(float x) {
  float t = mla(x, kLog2e, kRound);    // k + 1.5 * 2^23: k sits in the low bits of t
  float k = t - kRound;
  float r = mla(-k, kLn2Lo, mla(-k, kLn2Hi, x));
  return from_bits(bits(exp_small(r)) + (bits(t) << 23));   // bits(t) << 23 == k << 23 (mod 2^32)
}
}  // namespace tdbg_detail

TDBG_INLINE float tdbg_expf(float x) {
  using namespace tdbg_detail;
  // clamped so 2^k stays in scale()'s range; blends that let NaN through (no fix-up afterwards)
  return exp_reduced(sel(gt(x, 89.0f), 89.0f, sel(lt(x, -104.0f), -104.0f, x)));
}

TDBG_INLINE float tdbg_exp2f(float x) {
  using namespace tdbg_detail;
  float xc = sel(gt(x, 129.0f), 129.0f, sel(lt(x, -151.0f), -151.0f, x));   // NaN passes, as in exp
  float t = xc + kRound;
  float k = t - kRound;
  float r = (xc - k) * 0.693147180559945309f;
  return scale(exp_small(r), static_cast<int32_t>(bits(t) - bits(kRound)));
}

TDBG_INLINE float tdbg_expm1f(float x) {
  using namespace tdbg_detail;
  float xc = clamp(x, -30.0f, 89.0f);        // expm1(-30) rounds to -1
  Reduced t = reduce_ln2(xc);
  float q = expm1_small(t.r);
  int32_t n = static_cast<int32_t>(t.k);
  float big = scale(1.0f + q, n);                                  // e^x (the -1 is below 1/8 ulp)
  float p2 = from_bits(static_cast<uint32_t>((n & -static_cast<int32_t>(n < 27)) + 127) << 23);  // n < 27 ? n : 0
  float mid = mla(p2, q, p2 - 1.0f);                                // 2^n q + (2^n - 1), exact parts
  float y = sel(n > 26, big, mid);
  return sel(x == 0.0f, x, y) + nan_if(isnan(x));                   // keeps -0
}

TDBG_INLINE float tdbg_logf(float x) {
  using namespace tdbg_detail;
  Split s = split_exponent(x);
  float y = mla(s.k, kLn2Hi, log_mantissa(s.m, s.k * kLn2Lo));      // finite for every x
  return log_special(x, y);
}

TDBG_INLINE float tdbg_log2f(float x) {
  using namespace tdbg_detail;
  Split s = split_exponent(x);
  float y = s.k + log_mantissa(s.m, 0.0f) * kLog2e;                 // exact for powers of two
  return log_special(x, y);
}

TDBG_INLINE float tdbg_log1pf(float x) {
  using namespace tdbg_detail;
  float u = 1.0f + x;
  float c_big = 1.0f - (u - x), c_small = x - (u - 1.0f);
  float c = sel(ge(u, 2.0f), c_big, c_small);                         // exact rounding error of u
  float uc = sel(gt(u, 0.0f) & lt(u, kInf), u, 1.0f);              // & not &&: no branch
  Split s = split_exponent(uc);
  float y = mla(s.k, kLn2Hi, log_mantissa(s.m, s.k * kLn2Lo)) + c / uc;
  float special = x == -1.0f ? -kInf : (x == kInf ? kInf : -0.0f);
  y = sel(lt(__builtin_fabsf(x), 0x1p-24f), x, y);                     // rounds to x; keeps -0
  return sel((x == kInf) | (x == -1.0f), special, y) + nan_if(isnan(x) | lt(x, -1.0f));
}

TDBG_INLINE float tdbg_erff(float x) {
  using namespace tdbg_detail;
  // |x| clamped to 4 (erf rounds to 1 from 3.92 on); NaN passes (a blend, no branch)
  float a = __builtin_fabsf(x);
  a = sel(gt(a, 4.0f), 4.0f, a);
  float z = a * a;
  // |x| < 0.9: erf(x) = x + x (P(x^2) - 1), relative error below 1.2e-8 (the 1 kept out of
  // the polynomial so its rounding stays small)
  float p = horner(z, -6.09036011e-04f, 5.01196273e-03f, -2.67789085e-02f, 1.12821408e-01f, -3.76125246e-01f,
                   1.28379151e-01f);
  float small = mla(a, p, a);
  // 0.9 <= |x|: erf = 1 - e^{-x^2} H(x). Both arms are computed for every lane; on [0, 4] the
  // big arm stays finite, and a NaN reaches it through H.
  float big = mla(-exp_normal(-z), erfc_scaled(a), 1.0f);
  return copysign(sel(lt(a, 0.9f), small, big), x);
}

TDBG_INLINE float tdbg_tanhf(float x) {
  using namespace tdbg_detail;
  float a = __builtin_fabsf(x);
  float z = a * a;
  // |x| < 0.625: x + x^3 P(x^2), relative error below 4.4e-9
  float p = horner(z, -5.70498686e-03f, 2.06390861e-02f, -5.37397154e-02f, 1.33314416e-01f, -3.33332807e-01f);
  float small = mla(a * z, p, a);
  // otherwise 1 - 2 / (e^{2|x|} + 1); tanh rounds to 1 beyond 10
  float ab = sel(lt(a, 10.0f), a, 10.0f);                         // NaN -> 10
  float big = 1.0f - 2.0f / (exp_normal(2.0f * ab) + 1.0f);     // e^20 is normal
  return copysign(sel(lt(a, 0.625f), small, big), x) + nan_if(isnan(x));
}

// 1 / (1 + e^-x), as e / (1 + e) with e = e^-|x| for x < 0 so it underflows gracefully; the
// rounding error of 1 + e is corrected.
TDBG_INLINE float tdbg_sigmoidf(float x) {
  using namespace tdbg_detail;
  float m = -__builtin_fabsf(x);
  float e = exp_reduced(sel(lt(m, -104.0f), -104.0f, m));          // m <= 0: no upper clamp; NaN passes
  float d = 1.0f + e;
  float d_err = (1.0f - d) + e;                                     // 1 + e == d + d_err exactly
  float q = sel(lt(x, 0.0f), e, 1.0f) / d;
  // q (1 - d_err / d): the correction is below half an ulp of q, so 1 / d on [1, 2] needs no
  // precision: 1.45711 - d / 2 is within 4.3% (and no second division)
  return mla(-q, d_err * mla(d, -0.5f, 1.45710678f), q);
}

// ---- the names generated code calls: float -> above, double -> libm, integers -> as float ----
#define TDBG_UNARY(name, fimpl, dimpl)                                                       \
  TDBG_INLINE float name(float x) { return fimpl(x); }                                       \
  inline double name(double x) { return dimpl(x); }                                          \
  template <class T> TDBG_INLINE float name(T x) { return fimpl(static_cast<float>(x)); }
TDBG_UNARY(tdbg_exp, tdbg_expf, __builtin_exp)
TDBG_UNARY(tdbg_exp2, tdbg_exp2f, __builtin_exp2)
TDBG_UNARY(tdbg_expm1, tdbg_expm1f, __builtin_expm1)
TDBG_UNARY(tdbg_log, tdbg_logf, __builtin_log)
TDBG_UNARY(tdbg_log2, tdbg_log2f, __builtin_log2)
TDBG_UNARY(tdbg_log10, __builtin_log10f, __builtin_log10)
TDBG_UNARY(tdbg_log1p, tdbg_log1pf, __builtin_log1p)
TDBG_UNARY(tdbg_sqrt, __builtin_sqrtf, __builtin_sqrt)
TDBG_UNARY(tdbg_sin, __builtin_sinf, __builtin_sin)
TDBG_UNARY(tdbg_cos, __builtin_cosf, __builtin_cos)
TDBG_UNARY(tdbg_tan, __builtin_tanf, __builtin_tan)
TDBG_UNARY(tdbg_asin, __builtin_asinf, __builtin_asin)
TDBG_UNARY(tdbg_acos, __builtin_acosf, __builtin_acos)
TDBG_UNARY(tdbg_atan, __builtin_atanf, __builtin_atan)
TDBG_UNARY(tdbg_sinh, __builtin_sinhf, __builtin_sinh)
TDBG_UNARY(tdbg_cosh, __builtin_coshf, __builtin_cosh)
TDBG_UNARY(tdbg_tanh, tdbg_tanhf, __builtin_tanh)
TDBG_UNARY(tdbg_asinh, __builtin_asinhf, __builtin_asinh)
TDBG_UNARY(tdbg_acosh, __builtin_acoshf, __builtin_acosh)
TDBG_UNARY(tdbg_atanh, __builtin_atanhf, __builtin_atanh)
TDBG_UNARY(tdbg_erf, tdbg_erff, __builtin_erf)
TDBG_UNARY(tdbg_erfc, __builtin_erfcf, __builtin_erfc)
TDBG_UNARY(tdbg_lgamma, __builtin_lgammaf, __builtin_lgamma)
#undef TDBG_UNARY

TDBG_INLINE float tdbg_sigmoid(float x) { return tdbg_sigmoidf(x); }
inline double tdbg_sigmoid(double x) { return 1.0 / (1.0 + __builtin_exp(-x)); }
template <class T> TDBG_INLINE float tdbg_sigmoid(T x) { return tdbg_sigmoidf(static_cast<float>(x)); }

#define TDBG_BINARY(name, fimpl, dimpl)                                                      \
  TDBG_INLINE float name(float a, float b) { return fimpl(a, b); }                           \
  inline double name(double a, double b) { return dimpl(a, b); }
TDBG_BINARY(tdbg_atan2, __builtin_atan2f, __builtin_atan2)
TDBG_BINARY(tdbg_hypot, __builtin_hypotf, __builtin_hypot)
TDBG_BINARY(tdbg_copysign, __builtin_copysignf, __builtin_copysign)
TDBG_BINARY(tdbg_fmod_fp, __builtin_fmodf, __builtin_fmod)
TDBG_BINARY(tdbg_pow_fp, __builtin_powf, __builtin_pow)
#undef TDBG_BINARY

// ---- generic element helpers: branch-free selects so loops using them vectorize --------------
template <class T> TDBG_INLINE bool tdbg_isnan(T a) {
  if constexpr (tdbg_is_float<T>) { return a != a; } else { return false; }
}
template <class T> TDBG_INLINE bool tdbg_isinf(T a) {
  if constexpr (tdbg_is_float<T>) { return a == tdbg_limits<T>::infinity() || a == -tdbg_limits<T>::infinity(); }
  else { return false; }
}
// float: the sign bit as an int32 compare. g++ 12 ICEs ("unrecognizable insn") vectorizing
// __builtin_signbit of a float that a bit cast made (a bf16 load).
template <class T> TDBG_INLINE bool tdbg_signbit(T a) {
  if constexpr (tdbg_is_float<T> && sizeof(T) == 4) { return __builtin_bit_cast(int32_t, a) < 0; }
  else if constexpr (tdbg_is_float<T>) { return __builtin_signbit(a) != 0; }
  else { return a < T(0); }
}

// NaN-propagating max/min (torch.maximum / torch.minimum: ties return the first operand).
template <class T> TDBG_INLINE T tdbg_maximum(T a, T b) {
  T m = a < b ? b : a;
  return tdbg_isnan(b) ? b : (tdbg_isnan(a) ? a : m);
}
template <class T> TDBG_INLINE T tdbg_minimum(T a, T b) {
  T m = b < a ? b : a;
  return tdbg_isnan(b) ? b : (tdbg_isnan(a) ? a : m);
}
// torch.fmax / fmin: NaN only when both are NaN.
template <class T> TDBG_INLINE T tdbg_fmax(T a, T b) {
  T m = a < b ? b : a;
  return tdbg_isnan(a) ? b : (tdbg_isnan(b) ? a : m);
}
template <class T> TDBG_INLINE T tdbg_fmin(T a, T b) {
  T m = b < a ? b : a;
  return tdbg_isnan(a) ? b : (tdbg_isnan(b) ? a : m);
}

template <class T> TDBG_INLINE T tdbg_abs(T a) {
  if constexpr (tdbg_is_bool<T> || tdbg_is_unsigned<T>) { return a; }
  else if constexpr (sizeof(T) == 4 && tdbg_is_float<T>) { return __builtin_fabsf(a); }
  else if constexpr (tdbg_is_float<T>) { return __builtin_fabs(a); }
  else { return static_cast<T>(a < 0 ? -a : a); }
}

template <class T> TDBG_INLINE T tdbg_relu(T a) { return a < T(0) ? T(0) : a; }

template <class T> TDBG_INLINE T tdbg_sign(T a) {
  if constexpr (tdbg_is_bool<T>) { return a; }
  else { return static_cast<T>((T(0) < a) - (a < T(0))); }  // sign(NaN) == 0 as in torch
}

template <class T> TDBG_INLINE T tdbg_rsqrt(T a) { return T(1) / tdbg_sqrt(a); }
template <class T> TDBG_INLINE T tdbg_reciprocal(T a) { return T(1) / a; }

// floor/ceil/trunc from nearbyint (which vectorizes; g++ keeps vector floor/ceil/trunc scalar
// unless -fno-trapping-math). Exact: a rounded value is adjusted only when |x| < 2^23.
template <class T> TDBG_INLINE T tdbg_nearbyint(T a) {
  if constexpr (sizeof(T) == 4) { return __builtin_nearbyintf(a); } else { return __builtin_nearbyint(a); }
}
template <class T> TDBG_INLINE T tdbg_round(T a) {
  if constexpr (tdbg_is_float<T>) { return tdbg_nearbyint(a); } else { return a; }
}
template <class T> TDBG_INLINE T tdbg_floor(T a) {
  if constexpr (tdbg_is_float<T>) { T t = tdbg_nearbyint(a), down = t - T(1); return tdbg_detail::sel(__builtin_isgreater(t, a), down, t); }
  else { return a; }
}
template <class T> TDBG_INLINE T tdbg_ceil(T a) {
  if constexpr (tdbg_is_float<T>) { T t = tdbg_nearbyint(a), up = t + T(1); return tdbg_detail::sel(__builtin_isless(t, a), up, t); }
  else { return a; }
}
template <class T> TDBG_INLINE T tdbg_trunc(T a) {
  if constexpr (tdbg_is_float<T>) { return tdbg_copysign(tdbg_floor(tdbg_abs(a)), a); } else { return a; }
}
template <class T> TDBG_INLINE T tdbg_frac(T a) { return a - tdbg_trunc(a); }

// Python-style floor division and remainder (torch.floor_divide / torch.remainder).
template <class T> inline T tdbg_floordiv(T a, T b) {
  if constexpr (tdbg_is_float<T>) {
    if (b == 0) return a / b;
    T mod = tdbg_fmod_fp(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    if (div == 0) return tdbg_copysign(T(0), a / b);
    T floordiv = tdbg_floor(div);
    if (div - floordiv > T(0.5)) floordiv += T(1);
    return floordiv;
  } else if constexpr (tdbg_is_unsigned<T> || tdbg_is_bool<T>) {
    return static_cast<T>(a / b);
  } else {
    T q = static_cast<T>(a / b);
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
  }
}
template <class T> inline T tdbg_remainder(T a, T b) {
  if constexpr (tdbg_is_float<T>) {
    T mod = tdbg_fmod_fp(a, b);
    if (mod != 0 && ((b < 0) != (mod < 0))) mod += b;
    return mod;
  } else if constexpr (tdbg_is_unsigned<T> || tdbg_is_bool<T>) {
    return static_cast<T>(a % b);
  } else {
    T r = static_cast<T>(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  }
}
template <class T> inline T tdbg_fmod(T a, T b) {
  if constexpr (tdbg_is_float<T>) { return tdbg_fmod_fp(a, b); }
  else { return static_cast<T>(a % b); }
}
template <class T> inline T tdbg_truncdiv(T a, T b) {
  if constexpr (tdbg_is_float<T>) { return tdbg_trunc(a / b); }
  else { return static_cast<T>(a / b); }
}

// A constant float exponent takes eager's formulas (torch's pow_tensor_scalar kernel: 2 -> a*a,
// 3 -> a*a*a, 0.5 -> sqrt, -0.5 -> rsqrt, -1 -> 1/a, -2 -> 1/(a*a)): the same bits as eager, and
// no libm call left to keep the loop scalar. Anything else is powf/pow.
template <class T> TDBG_INLINE T tdbg_pow_const(T a, T b) {
  if (b == T(2)) return a * a;
  if (b == T(3)) return a * a * a;
  if (b == T(0.5)) return tdbg_sqrt(a);
  if (b == T(-0.5)) return T(1) / tdbg_sqrt(a);
  if (b == T(-1)) return T(1) / a;
  if (b == T(-2)) return T(1) / (a * a);
  return tdbg_pow_fp(a, b);
}
template <class T> TDBG_INLINE T tdbg_pow(T a, T b) {
  if constexpr (tdbg_is_float<T>) { return __builtin_constant_p(b) ? tdbg_pow_const(a, b) : tdbg_pow_fp(a, b); }
  else if constexpr (tdbg_is_bool<T>) { return a || !b; }
  else {
    if (b < 0) { return static_cast<T>(a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0)); }
    T result = 1;
    while (b) { if (b & 1) result = static_cast<T>(result * a); b >>= 1; a = static_cast<T>(a * a); }
    return result;
  }
}

template <class T> inline T tdbg_shl(T a, T b) {
  typedef typename tdbg_unsigned<T>::type U;
  if (b < 0 || b >= T(sizeof(T) * 8)) return 0;
  return static_cast<T>(static_cast<U>(a) << b);
}
template <class T> inline T tdbg_shr(T a, T b) {
  if (b < 0 || b >= T(sizeof(T) * 8)) return !tdbg_is_unsigned<T> && a < 0 ? T(-1) : T(0);
  return static_cast<T>(a >> b);
}

// argmax/argmin update: strict comparison keeps the first index; NaN wins and stays.
template <class T> TDBG_INLINE bool tdbg_arg_better_max(T cand, T acc) {
  return !tdbg_isnan(acc) && (tdbg_isnan(cand) || cand > acc);
}
template <class T> TDBG_INLINE bool tdbg_arg_better_min(T cand, T acc) {
  return !tdbg_isnan(acc) && (tdbg_isnan(cand) || cand < acc);
}

// ---- random numbers (compiler/lowering_random.py) -------------------------------------------
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so every element's value is a pure function of (seed, stream,
// offset) and loops over elements stay independent (vectorizable, parallel, fusable). Branch-free.
struct tdbg_philox_out { uint32_t x0, x1; };
TDBG_INLINE tdbg_philox_out tdbg_philox(int64_t seed, int64_t stream, int64_t offset) {
  uint32_t c0 = static_cast<uint32_t>(offset), c1 = static_cast<uint32_t>(static_cast<uint64_t>(offset) >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(static_cast<uint64_t>(stream) >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(static_cast<uint64_t>(seed) >> 32);
#pragma GCC unroll 10
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1); c3 = static_cast<uint32_t>(p0);
    c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  return {c0, c1};
}
// uniform on [0, 1): float from 24 random bits, double from 53 (every value a multiple of 2^-24
// / 2^-53, as torch's CPU uniform)
template <class T> TDBG_INLINE T tdbg_rand(int64_t seed, int64_t stream, int64_t offset) {
  tdbg_philox_out r = tdbg_philox(seed, stream, offset);
  if constexpr (sizeof(T) == 4) { return static_cast<float>(r.x0 >> 8) * 0x1p-24f; }
  else { return static_cast<double>(((static_cast<uint64_t>(r.x0) << 32) | r.x1) >> 11) * 0x1p-53; }
}
// standard normal by Box-Muller over two independent 32-bit words, in double (u1 in (0, 1])
template <class T> TDBG_INLINE T tdbg_randn(int64_t seed, int64_t stream, int64_t offset) {
  tdbg_philox_out r = tdbg_philox(seed, stream, offset);
  double u1 = (static_cast<double>(r.x0) + 1.0) * 0x1p-32, u2 = static_cast<double>(r.x1) * 0x1p-32;
  return static_cast<T>(__builtin_sqrt(-2.0 * __builtin_log(u1)) * __builtin_cos(6.283185307179586 * u2));
}

// ---- bf16 / fp16 storage (compiler/ops.py LOWP_CONVERT) ----------------------------------------
// A bf16/fp16 buffer is uint16_t bits in memory; kernels compute on float (as eager's CPU kernels
// do) and round to nearest even only when storing or casting. Branch-free integer bit casts and
// selects, so `#pragma omp simd` loops that load or store these types still vectorize.
TDBG_INLINE float tdbg_bf16_to_float(uint16_t h) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16);
}
// round to nearest even; NaN -> 0xFFFF, the NaN eager's vectorized CPU conversion writes (a
// NaN's payload could otherwise round to infinity; signbit of it is true in eager too)
TDBG_INLINE uint16_t tdbg_float_to_bf16(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(f != f ? 0xFFFFu : r);
}
// IEEE binary16 conversions (exact widening; narrowing rounds to nearest even, overflow -> inf,
// NaN stays NaN) as branch-free integer selects, on every machine: g++ 12 does not vectorize
// _Float16 <-> float conversions (a GELU over [128, 3072] fp16 took 7.3 ms against 0.23 in bf16),
// and ternaries here were left as branches. Checked bit-exact against torch's conversions over all
// 65536 halves and 17M floats (every half's neighbours +-3 ulps and random bit patterns).
TDBG_INLINE uint32_t tdbg_f16_sel(bool c, uint32_t a, uint32_t b) {
  uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}
TDBG_INLINE float tdbg_f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, em = h & 0x7FFFu;
  uint32_t normal = (em << 13) + 0x38000000u;                      // rebias exponent 15 -> 127
  uint32_t special = (em << 13) | 0x7F800000u;                     // inf / NaN
  // em * 2^-24, exact
  uint32_t sub = __builtin_bit_cast(uint32_t, static_cast<float>(static_cast<int32_t>(em)) * 5.9604644775390625e-08f);
  uint32_t r = tdbg_f16_sel(em >= 0x7C00u, special, tdbg_f16_sel(em < 0x0400u, sub, normal));
  return __builtin_bit_cast(float, r | sign);
}
TDBG_INLINE uint16_t tdbg_float_to_f16(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f), sign = (u >> 16) & 0x8000u;
  u &= 0x7FFFFFFFu;
  // |f| < 2^-14: the float add of 0.5 rounds the value to a multiple of 2^-24 (nearest even)
  uint32_t sub = __builtin_bit_cast(uint32_t, __builtin_bit_cast(float, u) + 0.5f) - 0x3F000000u;
  uint32_t normal = (u + 0xC8000FFFu + ((u >> 13) & 1u)) >> 13;    // rebias 127 -> 15, round
  uint32_t big = tdbg_f16_sel(u > 0x7F800000u, 0x7E00u, 0x7C00u);  // NaN : overflow to inf
  uint32_t r = tdbg_f16_sel(u >= 0x47800000u, big, tdbg_f16_sel(u < 0x38800000u, sub, normal));
  return static_cast<uint16_t>(r | sign);
}
