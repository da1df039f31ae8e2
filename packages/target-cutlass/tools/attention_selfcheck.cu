// Self-check of the CuTe C++ attention forward (src/mosaic_target_cutlass/templates/attention_sm90.cuh): runs a few
// knob configurations on small random problems on an sm_90 GPU and compares each output with a float64 CPU reference,
// one line per case (max abs error, the worst error relative to its error band, PASS/FAIL). Before that, on the host,
// it checks the fragment maps every configuration relies on (no GPU needed: `--host-only` stops there).
//
// Build and run: tools/attention_selfcheck.sh (nvcc, static cudart). Exit status: 0 all passed, 1 a case failed,
// 2 no usable GPU (the host checks still ran and passed). A launch that has not finished after 30 s (a hang) is a
// FAIL line and ends the program with status 1.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "attention_sm90.cuh"

namespace ma = mosaic_attention;
using bf16 = cutlass::bfloat16_t;
using f16 = cutlass::half_t;

struct Problem {
  int batch, seq, heads, kv_heads;
};

// precision of the 16-bit formats: mantissa bits (the unit roundoff is 2^-(p)) and the smallest normal exponent
template <class E> struct Format;
template <> struct Format<bf16> { static constexpr int p = 8; static constexpr int emin = -126; static constexpr const char* name = "bf16"; };
template <> struct Format<f16> { static constexpr int p = 11; static constexpr int emin = -14; static constexpr const char* name = "f16"; };

// half the spacing of the format at |x| (the output rounding)
template <class E> double half_ulp(double x) {
  int e = x > 0 ? int(std::floor(std::log2(x))) : Format<E>::emin;
  if (e < Format<E>::emin) e = Format<E>::emin;
  return std::ldexp(1.0, e - (Format<E>::p - 1)) / 2;
}

// o[b, h, i, :] = sum_j softmax_j(q.k / sqrt(d) [j <= i]) v[b, h / group, j, :], in float64; pv = sum_j p |v| (for the
// error band)
template <class E>
void reference(std::vector<E> const& q, std::vector<E> const& k, std::vector<E> const& v, Problem pr, int d,
               bool causal, std::vector<double>& out, std::vector<double>& pv) {
  int const group = pr.heads / pr.kv_heads;
  double const scale = 1.0 / std::sqrt(double(d));
  out.assign(size_t(pr.batch) * pr.heads * pr.seq * d, 0.0);
  pv = out;
  std::vector<double> s(pr.seq);
  for (int b = 0; b < pr.batch; ++b)
    for (int h = 0; h < pr.heads; ++h) {
      size_t const qo = (size_t(b) * pr.heads + h) * pr.seq * d;
      size_t const kvo = (size_t(b) * pr.kv_heads + h / group) * pr.seq * d;
      for (int i = 0; i < pr.seq; ++i) {
        int const last = causal ? i : pr.seq - 1;
        double mx = -INFINITY;
        for (int j = 0; j <= last; ++j) {
          double acc = 0;
          for (int c = 0; c < d; ++c) acc += double(float(q[qo + size_t(i) * d + c])) * double(float(k[kvo + size_t(j) * d + c]));
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= last; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= last; ++j) {
          double const pj = s[j] / sum;
          for (int c = 0; c < d; ++c) {
            double const vj = double(float(v[kvo + size_t(j) * d + c]));
            out[qo + size_t(i) * d + c] += pj * vj;
            pv[qo + size_t(i) * d + c] += pj * std::fabs(vj);
          }
        }
      }
    }
}

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::printf("    CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return false;                                                                            \
    }                                                                                          \
  } while (0)

template <class Cfg>
const char* label() {
  static char buf[160];
  std::snprintf(buf, sizeof buf, "%s d%d %dx%d s%d wg%d %s%s p_in=%s", Format<typename Cfg::Element>::name, Cfg::D,
                Cfg::BM, Cfg::BN, Cfg::Stages, Cfg::ConsumerWGs, Cfg::Causal ? "causal" : "full",
                Cfg::Causal ? (Cfg::CausalSkip ? "+skip" : "+noskip") : "", Cfg::PInRegs ? "registers" : "smem");
  return buf;
}

template <class Cfg>
bool host_check() {
  int bad = ma::check_fragment_maps<Cfg>();
  std::printf("host  %-52s fragment maps: %s (%d violations)\n", label<Cfg>(), bad ? "FAIL" : "ok", bad);
  return bad == 0;
}

// One case on the GPU: random normal inputs rounded to the element type, NaN-poisoned output, one launch, compare.
template <class Cfg>
bool run_case(Problem pr, unsigned seed) {
  using E = typename Cfg::Element;
  constexpr int d = Cfg::D;
  size_t const nq = size_t(pr.batch) * pr.heads * pr.seq * d, nkv = size_t(pr.batch) * pr.kv_heads * pr.seq * d;
  std::vector<E> q(nq), k(nkv), v(nkv), o(nq);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& x : q) x = E(normal(rng));
  for (auto& x : k) x = E(normal(rng));
  for (auto& x : v) x = E(normal(rng));

  E *dq, *dk, *dv, *dout;
  CHECK_CUDA(cudaMalloc(&dq, nq * sizeof(E)));
  CHECK_CUDA(cudaMalloc(&dk, nkv * sizeof(E)));
  CHECK_CUDA(cudaMalloc(&dv, nkv * sizeof(E)));
  CHECK_CUDA(cudaMalloc(&dout, nq * sizeof(E)));
  CHECK_CUDA(cudaMemcpy(dq, q.data(), nq * sizeof(E), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dk, k.data(), nkv * sizeof(E), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, v.data(), nkv * sizeof(E), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dout, 0xFF, nq * sizeof(E)));  // NaN: an element never written cannot pass

  auto params = ma::make_params<Cfg>(dq, dk, dv, dout, pr.batch, pr.seq, pr.heads, pr.kv_heads);
  cudaEvent_t done;
  CHECK_CUDA(cudaEventCreate(&done));
  CHECK_CUDA(ma::launch<Cfg>(params, 0));
  CHECK_CUDA(cudaEventRecord(done, 0));
  // a wrong barrier protocol hangs rather than fails: give the launch 30 s, then report it and end the process
  auto const start = std::chrono::steady_clock::now();
  while (cudaEventQuery(done) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
      std::printf("gpu   %-52s b=%d seq=%d heads=%d kv_heads=%d: no result after 30 s (a hang)  FAIL\n", label<Cfg>(),
                  pr.batch, pr.seq, pr.heads, pr.kv_heads);
      std::fflush(stdout);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEventDestroy(done);
  CHECK_CUDA(cudaMemcpy(o.data(), dout, nq * sizeof(E), cudaMemcpyDeviceToHost));
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout);

  std::vector<double> ref, pv;
  reference(q, k, v, pr, d, Cfg::Causal, ref, pv);
  // band: P rounded to the input format (in the numerator, not in the fp32 row sum) -> 2 u relative to P|V|, with a
  // factor 2 of margin, plus half an output ulp and fp32 noise
  double const u = std::ldexp(1.0, -Format<E>::p);
  double max_err = 0, worst = 0;
  size_t nonfinite = 0, first_bad = size_t(-1);
  for (size_t i = 0; i < nq; ++i) {
    double const got = double(float(o[i]));
    if (!std::isfinite(got)) { ++nonfinite; if (first_bad == size_t(-1)) first_bad = i; continue; }
    double const err = std::fabs(got - ref[i]);
    double const band = 4 * u * pv[i] + half_ulp<E>(std::fabs(ref[i])) + 1e-6;
    max_err = std::max(max_err, err);
    if (err / band > worst) { worst = err / band; if (err > band && first_bad == size_t(-1)) first_bad = i; }
  }
  bool const pass = nonfinite == 0 && worst <= 1.0;
  std::printf("gpu   %-52s b=%d seq=%d heads=%d kv_heads=%d: max abs err %.3e, worst err/band %.3f, %zu non-finite  %s\n",
              label<Cfg>(), pr.batch, pr.seq, pr.heads, pr.kv_heads, max_err, worst, nonfinite, pass ? "PASS" : "FAIL");
  if (!pass && first_bad != size_t(-1)) {
    size_t const row = first_bad / d;
    std::printf("      first bad element: flat %zu (row %zu of (b,h,i), col %zu): got %g, want %g\n", first_bad, row,
                first_bad % d, double(float(o[first_bad])), ref[first_bad]);
  }
  return pass;
}

// the configurations checked: the default (128x128, 2 stages, 2 consumer warpgroups, P in registers) non-causal and
// causal with block skipping; one consumer warpgroup of 128 rows; f16 head_dim 64 with P staged in shared memory,
// 3 stages, no block skipping
using Default = ma::Config<bf16, 128, 128, 128, 2, 2, false, true, true>;
using DefaultCausal = ma::Config<bf16, 128, 128, 128, 2, 2, true, true, true>;
using OneWG = ma::Config<bf16, 64, 128, 64, 2, 1, false, true, true>;
using SmemP = ma::Config<f16, 64, 64, 64, 3, 1, true, false, false>;

int main(int argc, char** argv) {
  bool const host_only = argc > 1 && std::strcmp(argv[1], "--host-only") == 0;
  bool ok = host_check<Default>() & host_check<DefaultCausal>() & host_check<OneWG>() & host_check<SmemP>();
  if (!ok) { std::printf("FAIL: the fragment maps are wrong; not running on the GPU\n"); return 1; }
  if (host_only) return 0;

  int dev = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::printf("no CUDA device: GPU cases not run\n");
    return 2;
  }
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("device %s is sm_%d%d; the kernel is built for sm_90a: GPU cases not run\n", prop.name, prop.major, prop.minor);
    return 2;
  }
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  ok &= run_case<Default>({1, 256, 2, 2}, 1);
  ok &= run_case<DefaultCausal>({2, 200, 4, 2}, 2);       // causal, GQA (2 query heads per kv head), seq % 128 != 0
  ok &= run_case<OneWG>({1, 100, 3, 1}, 3);               // MQA, seq shorter than block_m
  ok &= run_case<SmemP>({1, 333, 4, 1}, 4);               // causal without skipping, seq % 64 != 0, f16
  ok &= run_case<DefaultCausal>({1, 1024, 2, 1}, 5);      // 8 query blocks, several K/V ring passes
  std::printf("%s\n", ok ? "ALL PASS" : "SOME CASES FAILED");
  return ok ? 0 : 1;
}
