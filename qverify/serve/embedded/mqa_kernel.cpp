// Decode attention over the MLA latent for one thread: every query row of a sequence (its heads, its speculative
// positions, the replicates sharing a prompt) reads the same latent rows. Built by mqa_kernel.py with
// torch.utils.cpp_extension; see there for why it exists and what it returns.
// Per sequence: blocks of BL latent rows; scores (2 rows x 4 queries per pass over the 576 values), online softmax
// (exp on 8 lanes), then the values (4 queries x 16 columns held in registers over the block). Each sequence is
// computed on its own, in a fixed order, so its result never depends on what else is in the batch.
#include <torch/extension.h>
#include <cmath>
#include <limits>
#include <vector>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float* p) { v8 v; __builtin_memcpy(&v, p, 32); return v; }
static inline void store8(float* p, v8 v) { __builtin_memcpy(p, &v, 32); }
static inline float hsum(v8 v) {
  // fixed order, so a row's result never depends on what else is computed
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

constexpr int BL = 32;  // latent rows per block
typedef int32_t vi8 __attribute__((vector_size(32)));

// exp on 8 lanes (Cephes' expf: range reduction by ln 2 in two parts, degree-5 polynomial; ~1 ulp); lanes below
// -87.3 (masked scores, -inf) give exactly 0
static inline v8 exp8(v8 x) {
  const v8 lo = x < -87.3f ? (v8){} - 1.f : (v8){};  // all-ones lanes where the result is 0
  v8 xc = x;
  for (int i = 0; i < 8; ++i) xc[i] = xc[i] < -87.3f ? -87.3f : (xc[i] > 88.3f ? 88.3f : xc[i]);
  v8 fx = xc * 1.44269504088896341f;
  for (int i = 0; i < 8; ++i) fx[i] = __builtin_floorf(fx[i] + 0.5f);
  v8 r = xc - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  v8 p = 1.9875691500E-4f * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  vi8 e = __builtin_convertvector(fx, vi8) + 127;
  e = e << 23;
  v8 pw;
  __builtin_memcpy(&pw, &e, 32);
  v8 y = p * pw;
  vi8 yi, mi;
  __builtin_memcpy(&yi, &y, 32);
  __builtin_memcpy(&mi, &lo, 32);
  yi = yi & ~(mi != 0);
  __builtin_memcpy(&y, &yi, 32);
  return y;
}

// one segment of one sequence's rows, continuing an online softmax (running max m, sum l, unnormalised out):
// q [R, W] (row stride qs), k [L, W] (row stride ks); query row r sees rows 0..lens[r]-1 (all L when lens is
// null); blocks past every row's length are never read
static void segment(const float* q, int64_t qs, int64_t R, const float* k, int64_t ks, int64_t L, int64_t W,
                    int64_t C, const int64_t* lens, int64_t lrs, float* out, int64_t os, std::vector<float>& m,
                    std::vector<float>& l, std::vector<float>& sbuf) {
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
    // scores: 4 rows of q against one latent row at a time (the latent row is loaded once for the 4)
    int64_t j = 0;
    for (; j + 2 <= nb; j += 2) {  // 2 latent rows x 4 query rows: 6 loads per 8 multiply-adds
      const float* ka = k + (j0 + j) * ks;
      const float* kb = ka + ks;
      int64_t r = 0;
      for (; r + 4 <= R; r += 4) {
        v8 a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
        const float *q0 = q + r * qs, *q1 = q0 + qs, *q2 = q1 + qs, *q3 = q2 + qs;
        for (int64_t w = 0; w < W; w += 8) {
          v8 x = load8(ka + w), y = load8(kb + w), u;
          u = load8(q0 + w); a0 += u * x; b0 += u * y;
          u = load8(q1 + w); a1 += u * x; b1 += u * y;
          u = load8(q2 + w); a2 += u * x; b2 += u * y;
          u = load8(q3 + w); a3 += u * x; b3 += u * y;
        }
        float* sr = s + r * BL + j;
        sr[0] = hsum(a0); sr[1] = hsum(b0); sr[BL] = hsum(a1); sr[BL + 1] = hsum(b1);
        sr[2 * BL] = hsum(a2); sr[2 * BL + 1] = hsum(b2); sr[3 * BL] = hsum(a3); sr[3 * BL + 1] = hsum(b3);
      }
      for (; r < R; ++r) {
        v8 a0 = {}, b0 = {};
        const float* q0 = q + r * qs;
        for (int64_t w = 0; w < W; w += 8) { v8 u = load8(q0 + w); a0 += u * load8(ka + w); b0 += u * load8(kb + w); }
        s[r * BL + j] = hsum(a0); s[r * BL + j + 1] = hsum(b0);
      }
    }
    for (; j < nb; ++j) {
      const float* kr = k + (j0 + j) * ks;
      for (int64_t r = 0; r < R; ++r) {
        v8 a0 = {};
        const float* q0 = q + r * qs;
        for (int64_t w = 0; w < W; w += 8) a0 += load8(q0 + w) * load8(kr + w);
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
      const float mn = std::max(m[r], bm);
      if (mn == NEG) { for (int64_t j = 0; j < nb; ++j) sr[j] = 0.f; continue; }
      const float scale = std::exp(m[r] - mn);  // exp(-inf) = 0 on the first block
      v8 acc = {};
      for (int64_t j = 0; j < BL; j += 8) {
        v8 e = exp8(load8(sr + j) - mn);
        store8(sr + j, e);
        acc += e;
      }
      const float sum = hsum(acc);
      l[r] = l[r] * scale + sum;
      m[r] = mn;
      if (scale != 1.f) for (int64_t c = 0; c < C; ++c) out[r * os + c] *= scale;
    }
    // values: out[r, c] += p[r, j] * k[j, c], 4 rows x 16 columns held in registers over the block
    for (int64_t c = 0; c < C; c += 16) {
      int64_t r = 0;
      for (; r + 4 <= R; r += 4) {
        float *o0 = out + r * os + c, *o1 = o0 + os, *o2 = o1 + os, *o3 = o2 + os;
        v8 x0 = load8(o0), y0 = load8(o0 + 8), x1 = load8(o1), y1 = load8(o1 + 8);
        v8 x2 = load8(o2), y2 = load8(o2 + 8), x3 = load8(o3), y3 = load8(o3 + 8);
        const float *p0 = s + r * BL, *p1 = p0 + BL, *p2 = p1 + BL, *p3 = p2 + BL;
        for (int64_t j = 0; j < nb; ++j) {
          const float* kr = k + (j0 + j) * ks + c;
          v8 ka = load8(kr), kb = load8(kr + 8);
          x0 += p0[j] * ka; y0 += p0[j] * kb; x1 += p1[j] * ka; y1 += p1[j] * kb;
          x2 += p2[j] * ka; y2 += p2[j] * kb; x3 += p3[j] * ka; y3 += p3[j] * kb;
        }
        store8(o0, x0); store8(o0 + 8, y0); store8(o1, x1); store8(o1 + 8, y1);
        store8(o2, x2); store8(o2 + 8, y2); store8(o3, x3); store8(o3 + 8, y3);
      }
      for (; r < R; ++r) {
        float* o0 = out + r * os + c;
        v8 x0 = load8(o0), y0 = load8(o0 + 8);
        const float* p0 = s + r * BL;
        for (int64_t j = 0; j < nb; ++j) {
          const float* kr = k + (j0 + j) * ks + c;
          x0 += p0[j] * load8(kr); y0 += p0[j] * load8(kr + 8);
        }
        store8(o0, x0); store8(o0 + 8, y0);
      }
    }
  }
}

static void start(int64_t R, int64_t C, float* out, int64_t os, std::vector<float>& m, std::vector<float>& l) {
  m.assign(R, -std::numeric_limits<float>::infinity());
  l.assign(R, 0.f);
  for (int64_t r = 0; r < R; ++r) for (int64_t c = 0; c < C; ++c) out[r * os + c] = 0.f;
}

// normalise the output; lse (optional) gets the log-sum-exp
static void finish(int64_t R, int64_t C, float* out, int64_t os, const std::vector<float>& m,
                   const std::vector<float>& l, float* lse) {
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
  TORCH_CHECK(W % 8 == 0 && C % 16 == 0 && C <= W, "shape");
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
  std::vector<float> sbuf, m, l;
  const float* qp = q.data_ptr<float>();
  const float* kp = rows.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    float* o = out.data_ptr<float>() + n * R * C;
    start(R, C, o, C, m, l);
    segment(qp + n * q.stride(0), q.stride(1), R, kp + n * rows.stride(0), rows.stride(1), L, W, C,
            lp ? lp + n * lns : nullptr, lrs, o, C, m, l, sbuf);
    finish(R, C, o, C, m, l, lse.data_ptr<float>() + n * R);
  }
  return {lse, out};
}

// A whole decode attention: sequence b attends to its prompt's rows (prompts[prompt_of[b]], [P, W], all visible)
// and then its own rows (gen [B, G, W], gen_lens [B, R or 1]) in one online softmax, so there is nothing to merge
// and nothing to gather. Sequences run in `order` (those sharing a prompt one after another: the prompt's rows are
// then still in cache for the next one). q [B, R, W] -> out [B, R, C], normalised.
torch::Tensor mqa_decode(torch::Tensor q, std::vector<torch::Tensor> prompts, torch::Tensor prompt_of,
                         torch::Tensor gen, torch::Tensor gen_lens, torch::Tensor order, int64_t C) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && gen.dtype() == torch::kFloat32, "fp32 only");
  TORCH_CHECK(q.stride(2) == 1 && gen.stride(2) == 1, "last dim contiguous");
  TORCH_CHECK(prompt_of.dtype() == torch::kInt64 && order.dtype() == torch::kInt64 && gen_lens.dtype() == torch::kInt64,
              "int64 indices");
  const int64_t B = q.size(0), R = q.size(1), W = q.size(2), G = gen.size(1);
  TORCH_CHECK(W % 8 == 0 && C % 16 == 0 && C <= W, "shape");
  for (auto& p : prompts) TORCH_CHECK(p.dtype() == torch::kFloat32 && p.stride(1) == 1 && p.size(1) == W, "prompt rows");
  auto out = torch::empty({B, R, C}, q.options());
  auto po = prompt_of.contiguous(), ord = order.contiguous();
  const int64_t lrs = gen_lens.size(1) == 1 ? 0 : gen_lens.stride(1);
  std::vector<float> sbuf, m, l;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t b = ord.data_ptr<int64_t>()[i];
    const torch::Tensor& p = prompts[po.data_ptr<int64_t>()[b]];
    const float* qb = q.data_ptr<float>() + b * q.stride(0);
    float* o = out.data_ptr<float>() + b * R * C;
    start(R, C, o, C, m, l);
    segment(qb, q.stride(1), R, p.data_ptr<float>(), p.stride(0), p.size(0), W, C, nullptr, 0, o, C, m, l, sbuf);
    segment(qb, q.stride(1), R, gen.data_ptr<float>() + b * gen.stride(0), gen.stride(1), G, W, C,
            gen_lens.data_ptr<int64_t>() + b * gen_lens.stride(0), lrs, o, C, m, l, sbuf);
    finish(R, C, o, C, m, l, nullptr);
  }
  return out;
}
