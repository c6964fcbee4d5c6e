// Decode attention over the MLA latent for one thread: every query row of a sequence (its heads, its speculative
// positions, the replicates sharing a prompt) reads the same latent rows. Built by mqa_kernel.py with
// torch.utils.cpp_extension; see there for why it exists and what it returns.
// Per sequence (a prompt's replicates stacked into one group of query rows): blocks of BL latent rows; scores in
// tiles of 4 query rows x JT latent rows (reduce_tile sums the tile's VL dot products at once), an online softmax
// whose max is rescaled lazily (RESCALE_GAP), then the values (4 rows x CV vectors held in registers over the
// block). Each sequence is computed on its own, in a fixed order, so its result never depends on what else is in
// the batch. After the attention: the small one-pass kernels (rope_qk, cast_to_fp4, fp8_roundtrip, gumbel_argmax).
#include <torch/extension.h>
#include <cmath>
#include <limits>
#include <algorithm>
#include <vector>
#include <c10/util/Float8_e4m3fn.h>
#include <immintrin.h>

// Lanes per vector: 16 where the build targets AVX-512 (mqa_kernel.py passes -mavx512f on such CPUs), else 8 (AVX2).
#if defined(__AVX512F__)
constexpr int VL = 16;
#else
constexpr int VL = 8;
#endif
typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));

static inline vf loadv(const float* p) { vf v; __builtin_memcpy(&v, p, sizeof(vf)); return v; }
static inline void storev(float* p, vf v) { __builtin_memcpy(p, &v, sizeof(vf)); }
static inline float hsum(vf v) {
  // a fixed order, so a row's result never depends on what else is computed
  float h[VL];
  __builtin_memcpy(h, &v, sizeof(vf));
  for (int w = VL / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) h[i] += h[i + w];
  return h[0];
}

constexpr float RESCALE_GAP = 8.f;  // e^8 ~ 3,000
constexpr int BL = 32;  // latent rows per block (a multiple of VL)

// Latent rows per score tile: 4 query rows x JT latent rows = VL accumulators (16 zmm of 32; 8 ymm of 16).
constexpr int JT = VL / 4;
// Column vectors per values tile: 4 rows x CV accumulators (16 zmm; 8 ymm)
constexpr int CV = VL == 16 ? 4 : 2;
#ifndef PF_HINT
#define PF_HINT 3
#endif
#ifndef PF_TILES
#define PF_TILES 1
#endif

// The VL horizontal sums of VL accumulators at once, lane i of the result = hsum(a[i]) bit for bit (each level
// adds lanes i and i + g/2 within groups of g, as hsum does): 15 vector adds for 16 sums instead of 15 scalar adds
// each, which took a third of the scores' time.
static inline vf reduce_tile(const vf* a) {
#if defined(__AVX512F__)
  vf t[8], u[4], v[2];
  for (int i = 0; i < 8; ++i)
    t[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    u[i] = __builtin_shufflevector(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(t[2 * i], t[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    v[i] = __builtin_shufflevector(u[2 * i], u[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(u[2 * i], u[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(v[0], v[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(v[0], v[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
  vf t[4], u[2];
  for (int i = 0; i < 4; ++i)
    t[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; ++i)
    u[i] = __builtin_shufflevector(t[2 * i], t[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           __builtin_shufflevector(t[2 * i], t[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(u[0], u[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(u[0], u[1], 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

// exp on VL lanes (Cephes' expf: range reduction by ln 2 in two parts, degree-5 polynomial; ~1 ulp); lanes below
// -87.3 (masked scores, -inf) give exactly 0
static inline vf expv(vf x) {
  const vi zero = x < -87.3f;  // all-ones lanes where the result is 0
  // clamp and floor as whole-vector operations (per-lane loops compiled to 16 scalar rounds each; the prefill
  // kernel calls this once per 16 scores); the same values as the per-lane forms
  const vf lo = vf{} + -87.3f, hi = vf{} + 88.3f;
  const vf xc = x < lo ? lo : (x > hi ? hi : x);
  vf fx = xc * 1.44269504088896341f;
  // the product rounded on its own before + 0.5, as the per-lane form rounded it (no fused multiply-add here)
#if defined(__AVX512F__)
  asm("" : "+v"(fx));
  fx = (vf)_mm512_roundscale_ps((__m512)(fx + 0.5f), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
#else
  asm("" : "+x"(fx));
  fx = (vf)_mm256_floor_ps((__m256)(fx + 0.5f));
#endif
  vf r = xc - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  vf p = 1.9875691500E-4f * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  vi e = __builtin_convertvector(fx, vi) + 127;
  e = e << 23;
  vf pw;
  __builtin_memcpy(&pw, &e, sizeof(vf));
  vf y = p * pw;
  vi yi;
  __builtin_memcpy(&yi, &y, sizeof(vf));
  yi = yi & ~zero;
  __builtin_memcpy(&y, &yi, sizeof(vf));
  return y;
}

// one segment of one sequence's rows, continuing an online softmax (running max m, sum l, unnormalised out):
// q [R, W] (row stride qs), k [L, W] (row stride ks); query row r sees rows 0..lens[r]-1 (all L when lens is
// null); blocks past every row's length are never read
static void segment(const float* q, int64_t qs, int64_t R, const float* k, int64_t ks, int64_t L, int64_t W,
                    int64_t C, const int64_t* lens, int64_t lrs, float* out, int64_t os, float* m, float* l,
                    std::vector<float>& sbuf) {
  if (lens) {
    int64_t most = 0;
    for (int64_t r = 0; r < R; ++r) most = std::max(most, lens[r * lrs]);
    L = std::min(L, most);
  }
  const float NEG = -std::numeric_limits<float>::infinity();
  sbuf.resize(R * BL);
  float* s = sbuf.data();
  for (int64_t j0 = 0; j0 < L; j0 += BL) {
    const int64_t nb = std::min<int64_t>(BL, L - j0);
    // scores: tiles of 4 query rows x JT latent rows, VL accumulators reduced together (reduce_tile)
    int64_t j = 0;
    for (; j + JT <= nb; j += JT) {
      const float* kj = k + (j0 + j) * ks;
      // rows PF_TILES tiles ahead, a line at a time: the hardware prefetcher alone kept too few reads in flight
      // (a sequence's own rows, read by its 4 query rows only, ran at ~6 GB/s against ~25 from L3)
      for (int ji = 0; ji < JT && j0 + j + PF_TILES * JT + ji < L; ++ji)
        for (int64_t w = 0; w < W; w += 16) __builtin_prefetch(kj + (PF_TILES * JT + ji) * ks + w, 0, PF_HINT);
      int64_t r = 0;
      for (; r + 4 <= R; r += 4) {
        vf acc[VL] = {};  // acc[qi * JT + ji]: query row r + qi against latent row j + ji
        const float* q0 = q + r * qs;
        for (int64_t w = 0; w < W; w += VL) {
          vf x[JT];
          for (int ji = 0; ji < JT; ++ji) x[ji] = loadv(kj + ji * ks + w);
          for (int qi = 0; qi < 4; ++qi) {
            const vf u = loadv(q0 + qi * qs + w);
            for (int ji = 0; ji < JT; ++ji) acc[qi * JT + ji] += u * x[ji];
          }
        }
        const vf sums = reduce_tile(acc);
        for (int qi = 0; qi < 4; ++qi)
          for (int ji = 0; ji < JT; ++ji) s[(r + qi) * BL + j + ji] = sums[qi * JT + ji];
      }
      for (; r < R; ++r) {
        const float* q0 = q + r * qs;
        for (int ji = 0; ji < JT; ++ji) {
          vf a0 = {};
          for (int64_t w = 0; w < W; w += VL) a0 += loadv(q0 + w) * loadv(kj + ji * ks + w);
          s[r * BL + j + ji] = hsum(a0);
        }
      }
    }
    for (; j < nb; ++j) {
      const float* kr = k + (j0 + j) * ks;
      for (int64_t r = 0; r < R; ++r) {
        vf a0 = {};
        const float* q0 = q + r * qs;
        for (int64_t w = 0; w < W; w += VL) a0 += loadv(q0 + w) * loadv(kr + w);
        s[r * BL + j] = hsum(a0);
      }
    }
    // online softmax over the block
    for (int64_t r = 0; r < R; ++r) {
      float* sr = s + r * BL;
      if (lens) {
        const int64_t valid = lens[r * lrs] - j0;
        for (int64_t j = std::max<int64_t>(valid, 0); j < nb; ++j) sr[j] = NEG;
      }
      for (int64_t j = nb; j < BL; ++j) sr[j] = NEG;  // a short last block: padding lanes give exp = 0
      float bm = NEG;
      for (int64_t j = 0; j < nb; ++j) bm = std::max(bm, sr[j]);
      // the running max moves only when a score exceeds it by more than RESCALE_GAP (exp of scores up to the gap
      // above it stays far from overflow, and the normalisation divides the same factor out): the output
      // rescale below then runs a few times per row instead of at most blocks
      const float mn = bm > m[r] + RESCALE_GAP || m[r] == NEG ? std::max(m[r], bm) : m[r];
      if (mn == NEG) { for (int64_t j = 0; j < nb; ++j) sr[j] = 0.f; continue; }
      const float scale = std::exp(m[r] - mn);  // exp(-inf) = 0 on the first block
      vf acc = {};
      for (int64_t j = 0; j < BL; j += VL) {
        vf e = expv(loadv(sr + j) - mn);
        storev(sr + j, e);
        acc += e;
      }
      const float sum = hsum(acc);
      l[r] = l[r] * scale + sum;
      m[r] = mn;
      if (scale != 1.f) for (int64_t c = 0; c < C; ++c) out[r * os + c] *= scale;
    }
    // values: out[r, c] += p[r, j] * k[j, c], 4 rows x CV vectors of columns held in registers over the block
    for (int64_t c = 0; c < C; c += CV * VL) {
      int64_t r = 0;
      for (; r + 4 <= R; r += 4) {
        vf acc[4][CV];
        for (int ri = 0; ri < 4; ++ri)
          for (int ci = 0; ci < CV; ++ci) acc[ri][ci] = loadv(out + (r + ri) * os + c + ci * VL);
        const float* p0 = s + r * BL;
        for (int64_t j = 0; j < nb; ++j) {
          const float* kr = k + (j0 + j) * ks + c;
          vf kv[CV];
          for (int ci = 0; ci < CV; ++ci) kv[ci] = loadv(kr + ci * VL);
          for (int ri = 0; ri < 4; ++ri) {
            const float pj = p0[ri * BL + j];
            for (int ci = 0; ci < CV; ++ci) acc[ri][ci] += pj * kv[ci];
          }
        }
        for (int ri = 0; ri < 4; ++ri)
          for (int ci = 0; ci < CV; ++ci) storev(out + (r + ri) * os + c + ci * VL, acc[ri][ci]);
      }
      for (; r < R; ++r) {
        vf acc[CV];
        for (int ci = 0; ci < CV; ++ci) acc[ci] = loadv(out + r * os + c + ci * VL);
        const float* p0 = s + r * BL;
        for (int64_t j = 0; j < nb; ++j)
          for (int ci = 0; ci < CV; ++ci) acc[ci] += p0[j] * loadv(k + (j0 + j) * ks + c + ci * VL);
        for (int ci = 0; ci < CV; ++ci) storev(out + r * os + c + ci * VL, acc[ci]);
      }
    }
  }
}

static void start(int64_t R, int64_t C, float* out, int64_t os, float* m, float* l) {
  for (int64_t r = 0; r < R; ++r) m[r] = -std::numeric_limits<float>::infinity(), l[r] = 0.f;
  for (int64_t r = 0; r < R; ++r) for (int64_t c = 0; c < C; ++c) out[r * os + c] = 0.f;
}

// normalise the output; lse (optional) gets the log-sum-exp
static void finish(int64_t R, int64_t C, float* out, int64_t os, const float* m, const float* l, float* lse) {
  for (int64_t r = 0; r < R; ++r) {
    if (l[r] > 0.f) {
      const float inv = 1.f / l[r];
      for (int64_t c = 0; c < C; ++c) out[r * os + c] *= inv;
      if (lse) lse[r] = m[r] + std::log(l[r]);
    } else if (lse) {
      lse[r] = -std::numeric_limits<float>::infinity();
    }
  }
}

// q [N, R, W], rows [N, L, W], lens [N, R or 1] int64 (optional: rows each query row sees) -> (lse [N, R, 1], out [N, R, C])
std::vector<torch::Tensor> mqa_partial(torch::Tensor q, torch::Tensor rows, c10::optional<torch::Tensor> lens, int64_t C) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && rows.dtype() == torch::kFloat32, "fp32 only");
  TORCH_CHECK(q.stride(2) == 1 && rows.stride(2) == 1, "last dim contiguous");
  const int64_t N = q.size(0), R = q.size(1), W = q.size(2), L = rows.size(1);
  TORCH_CHECK(W % VL == 0 && C % (CV * VL) == 0 && C <= W, "shape");
  auto out = torch::empty({N, R, C}, q.options());
  auto lse = torch::empty({N, R, 1}, q.options());
  const int64_t* lp = nullptr;
  int64_t lns = 0, lrs = 0;
  if (lens.has_value()) {
    auto& ln = *lens;
    TORCH_CHECK(ln.dtype() == torch::kInt64 && ln.dim() == 2, "lens: int64 [N, R or 1]");
    lp = ln.data_ptr<int64_t>();
    lns = ln.stride(0); lrs = ln.size(1) == 1 ? 0 : ln.stride(1);
  }
  std::vector<float> sbuf, m(R), l(R);
  const float* qp = q.data_ptr<float>();
  const float* kp = rows.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    float* o = out.data_ptr<float>() + n * R * C;
    start(R, C, o, C, m.data(), l.data());
    segment(qp + n * q.stride(0), q.stride(1), R, kp + n * rows.stride(0), rows.stride(1), L, W, C,
            lp ? lp + n * lns : nullptr, lrs, o, C, m.data(), l.data(), sbuf);
    finish(R, C, o, C, m.data(), l.data(), lse.data_ptr<float>() + n * R);
  }
  return {lse, out};
}

// A whole decode attention: sequence b attends to its prompt's rows (prompts[prompt_of[b]], [P, W], all visible)
// and then its own rows (gen [B, G, W], gen_lens [B, R or 1]) in one online softmax, so there is nothing to merge
// and nothing to gather. Sequences run in `order`; consecutive ones with the same prompt (an item's replicates)
// form a group whose query rows are stacked, so the prompt's rows are read once for all of them: at 4 heads a
// latent row serves 4 query rows per sequence, too few to pay for reading it (the scores ran at 30 GFLOP/s,
// bound by the reads), and 12 for 3 replicates. Every query row's arithmetic is the same whatever rows share its
// pass (each row's sums are its own, in a fixed order), so a sequence's result never depends on the batch.
// q [B, R, W] -> out [B, R, C], normalised.
torch::Tensor mqa_decode(torch::Tensor q, std::vector<torch::Tensor> prompts, torch::Tensor prompt_of,
                         torch::Tensor gen, torch::Tensor gen_lens, torch::Tensor order, int64_t C) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && gen.dtype() == torch::kFloat32, "fp32 only");
  TORCH_CHECK(q.stride(2) == 1 && gen.stride(2) == 1, "last dim contiguous");
  TORCH_CHECK(prompt_of.dtype() == torch::kInt64 && order.dtype() == torch::kInt64 && gen_lens.dtype() == torch::kInt64,
              "int64 indices");
  const int64_t B = q.size(0), R = q.size(1), W = q.size(2), G = gen.size(1);
  TORCH_CHECK(W % VL == 0 && C % (CV * VL) == 0 && C <= W, "shape");
  for (auto& p : prompts) TORCH_CHECK(p.dtype() == torch::kFloat32 && p.stride(1) == 1 && p.size(1) == W, "prompt rows");
  auto out = torch::empty({B, R, C}, q.options());
  auto po = prompt_of.contiguous(), ord = order.contiguous();
  const int64_t* pp = po.data_ptr<int64_t>();
  const int64_t* op = ord.data_ptr<int64_t>();
  const int64_t lrs = gen_lens.size(1) == 1 ? 0 : gen_lens.stride(1);
  std::vector<float> sbuf, m, l, qbuf, obuf;
  for (int64_t i = 0; i < B;) {
    int64_t n = 1;  // the group: order[i .. i + n) share a prompt
    while (i + n < B && pp[op[i + n]] == pp[op[i]]) ++n;
    const torch::Tensor& p = prompts[pp[op[i]]];
    qbuf.resize(n * R * W);
    obuf.resize(n * R * C);
    m.resize(n * R);
    l.resize(n * R);
    for (int64_t g = 0; g < n; ++g) {  // the group's query rows, stacked
      const float* qb = q.data_ptr<float>() + op[i + g] * q.stride(0);
      for (int64_t r = 0; r < R; ++r) std::copy(qb + r * q.stride(1), qb + r * q.stride(1) + W, qbuf.data() + (g * R + r) * W);
    }
    start(n * R, C, obuf.data(), C, m.data(), l.data());
    segment(qbuf.data(), W, n * R, p.data_ptr<float>(), p.stride(0), p.size(0), W, C, nullptr, 0, obuf.data(), C,
            m.data(), l.data(), sbuf);
    for (int64_t g = 0; g < n; ++g) {
      const int64_t b = op[i + g];
      float* ob = obuf.data() + g * R * C;
      segment(qbuf.data() + g * R * W, W, R, gen.data_ptr<float>() + b * gen.stride(0), gen.stride(1), G, W, C,
              gen_lens.data_ptr<int64_t>() + b * gen_lens.stride(0), lrs, ob, C, m.data() + g * R, l.data() + g * R,
              sbuf);
      finish(R, C, ob, C, m.data() + g * R, l.data() + g * R, nullptr);
      std::copy(ob, ob + R * C, out.data_ptr<float>() + b * R * C);
    }
    i += n;
  }
  return out;
}

// transformers' rope on one row of d values, the same expressions in the same order (fp-contract off: a product
// and a difference rounded separately, as torch's elementwise ops round them), so the same bits.
// interleave (apply_rotary_pos_emb_interleave): out[i] = x[2i] c[i] - x[2i+1] s[i], out[h + i] = x[2i+1] c[i] + x[2i] s[i];
// else (apply_rotary_pos_emb): out = x c + rotate_half(x) s, rotate_half(x) = (-x[h:], x[:h]).
__attribute__((optimize("fp-contract=off"))) static void rope_row(const float* x, int64_t xs, const float* c,
                                                                  const float* sn, int64_t d, bool interleave,
                                                                  float* out) {
  const int64_t h = d / 2;
  if (interleave) {
    for (int64_t i = 0; i < h; ++i) {
      const float a = x[2 * i * xs], b = x[(2 * i + 1) * xs];
      out[i] = a * c[i] - b * sn[i];
      out[h + i] = b * c[i] + a * sn[i];
    }
  } else {
    for (int64_t i = 0; i < h; ++i) out[i] = x[i * xs] * c[i] + (-x[(i + h) * xs]) * sn[i];
    for (int64_t i = h; i < d; ++i) out[i] = x[i * xs] * c[i] + x[(i - h) * xs] * sn[i];
  }
}

// The rope part of one layer's projections for N tokens, in one pass: q [N, H, dn + dr] (the query projection,
// any strides) -> q_rot [N, H, dr]; kv [N, C + dr] (kv_a_proj's output) -> latent[:, C:] (the cached key's rope
// part, written in place; the caller writes latent[:, :C]). cos, sin [N, 1, dr] or [N, dr], contiguous rows.
// It replaces two cats, two strided slices and six elementwise passes (14% of a prefill's projection time).
torch::Tensor rope_qk(torch::Tensor q, torch::Tensor kv, torch::Tensor cos, torch::Tensor sin, int64_t dn,
                      bool interleave, torch::Tensor latent) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && kv.dtype() == torch::kFloat32 && latent.dtype() == torch::kFloat32 &&
              cos.dtype() == torch::kFloat32 && sin.dtype() == torch::kFloat32, "fp32 only");
  const int64_t N = q.size(0), H = q.size(1), dr = q.size(2) - dn, C = kv.size(1) - dr;
  TORCH_CHECK(latent.size(0) == N && latent.size(1) == C + dr && latent.stride(1) == 1, "latent [N, C + dr]");
  auto cs = cos.reshape({N, dr}).contiguous(), sn = sin.reshape({N, dr}).contiguous();
  auto q_rot = torch::empty({N, H, dr}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = kv.data_ptr<float>(), *cp = cs.data_ptr<float>(), *sp = sn.data_ptr<float>();
  float *op = q_rot.data_ptr<float>(), *lp = latent.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < H; ++h)
      rope_row(qp + n * q.stride(0) + h * q.stride(1) + dn * q.stride(2), q.stride(2), cp + n * dr, sp + n * dr, dr,
               interleave, op + (n * H + h) * dr);
    rope_row(kp + n * kv.stride(0) + C * kv.stride(1), kv.stride(1), cp + n * dr, sp + n * dr, dr, interleave,
             lp + n * latent.stride(0) + C);
  }
  return q_rot;
}

// compressed-tensors' cast_to_fp4 (its eager CPU path: nearest FP4 E2M1 value, the same interval bounds, then
// times torch.sign), element for element the same values; out-of-place, contiguous fp32.
torch::Tensor cast_to_fp4(torch::Tensor x) {
  TORCH_CHECK(x.dtype() == torch::kFloat32, "fp32 only");
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t n = xc.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = xp[i];
    const float sign = static_cast<float>((0.f < v) - (v < 0.f));  // torch.sign (NaN: 0, and NaN * 0 is NaN)
    const float a = std::fabs(v);
    // the interval bounds as steps (branch-free, so the loop vectorizes): each FP4 value is a sum of exact halves
    const float q = 0.5f * (a > 0.25f) + 0.5f * (a >= 0.75f) + 0.5f * (a > 1.25f) + 0.5f * (a >= 1.75f) +
                    1.f * (a > 2.5f) + 1.f * (a >= 3.5f) + 2.f * (a > 5.f);
    op[i] = (a != a ? a : q) * sign;  // NaN matches no interval and stays NaN, as in the eager code
  }
  return out.view(x.sizes());
}

// kv_fp8.fp8_roundtrip in one pass: x / scale, clamped to +-max, rounded through float8_e4m3fn (c10's own
// conversion, the one torch's .to(float8_e4m3fn) runs on CPU), back to float, times scale; x [N, W] (any row
// stride, unit column stride), scale [W]. The same values as the five torch ops.
torch::Tensor fp8_roundtrip(torch::Tensor x, torch::Tensor scale, double max_abs) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && scale.dtype() == torch::kFloat32, "fp32 only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && scale.numel() == x.size(1), "x [N, W], scale [W]");
  auto sc = scale.contiguous();
  const int64_t N = x.size(0), W = x.size(1);
  auto out = torch::empty({N, W}, x.options());
  const float* sp = sc.data_ptr<float>();
  const float hi = static_cast<float>(max_abs);
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.data_ptr<float>() + n * x.stride(0);
    float* orow = out.data_ptr<float>() + n * W;
    for (int64_t w = 0; w < W; ++w) {
      const float y = std::min(std::max(xr[w] / sp[w], -hi), hi);  // torch.clamp: NaN stays NaN
      orow[w] = static_cast<float>(c10::Float8_e4m3fn(y)) * sp[w];
    }
  }
  return out;
}

// The sampler's Gumbel-max (sampler.py): per row, argmax over columns of z + Gumbel noise, the noise a function of
// (seed, step, token id) by the same counter hash as sampler.uniform_noise (murmur3's fmix32 on 32-bit lanes; the
// integer steps are exact, so the same uniforms), then -log(-log(u)) in double (libm's log: it may differ from
// torch's vectorised log in the last bit, which moves an argmax only on an exact tie).
// z [R, K] fp32 (-inf: not a candidate), seeds, steps [R] int64, tokens [R, K] int64 (the columns' token ids) or
// empty (column k is token k). Returns the winning column per row [R].
static inline uint64_t mix32(uint64_t x) {
  x ^= x >> 16;
  x = (x * 0x85EBCA6BULL) & 0xFFFFFFFFULL;
  x ^= x >> 13;
  x = (x * 0xC2B2AE35ULL) & 0xFFFFFFFFULL;
  return x ^ (x >> 16);
}

torch::Tensor gumbel_argmax(torch::Tensor z, torch::Tensor seeds, torch::Tensor steps, torch::Tensor tokens) {
  TORCH_CHECK(z.dtype() == torch::kFloat32 && z.dim() == 2, "z: fp32 [R, K]");
  TORCH_CHECK(seeds.dtype() == torch::kInt64 && steps.dtype() == torch::kInt64, "int64 seeds, steps");
  const int64_t R = z.size(0), K = z.size(1);
  const bool ids = tokens.numel() > 0;
  auto zc = z.contiguous(), sd = seeds.contiguous(), st = steps.contiguous();
  auto tk = ids ? tokens.contiguous() : tokens;
  auto out = torch::empty({R}, seeds.options());
  const uint64_t M = 0xFFFFFFFFULL;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t seed = sd.data_ptr<int64_t>()[r], step = st.data_ptr<int64_t>()[r];
    uint64_t h = mix32((static_cast<uint64_t>(seed) & M) ^ 0x243F6A88ULL);
    h = mix32(h ^ ((static_cast<uint64_t>((seed >> 32) + 0x85A308D3LL)) & M));
    h = mix32(h ^ ((static_cast<uint64_t>(step) * 0x9E3779B1ULL + 0x13198A2EULL) & M));
    const float* zr = zc.data_ptr<float>() + r * K;
    double best = -std::numeric_limits<double>::infinity();
    int64_t arg = 0;
    bool seen = false;
    for (int64_t k = 0; k < K; ++k) {
      const uint64_t t = static_cast<uint64_t>(ids ? tk.data_ptr<int64_t>()[r * K + k] : k);
      const uint64_t hi = mix32(mix32(h ^ t) ^ 0x03707344ULL);
      const uint64_t lo = mix32(mix32(hi ^ t) ^ 0xA4093822ULL);
      const double u = (static_cast<double>((hi << 21) | (lo >> 11)) + 0.5) / 9007199254740992.0;
      const double v = static_cast<double>(zr[k]) - std::log(-std::log(u));
      if (!seen || v > best) { best = v; arg = k; seen = true; }  // the first maximum, as torch.argmax
    }
    out.data_ptr<int64_t>()[r] = arg;
  }
  return out;
}

// the vector width this build was compiled for: W must be a multiple of it and C of CV times it
int64_t lanes() { return VL; }
int64_t value_columns() { return CV * VL; }
