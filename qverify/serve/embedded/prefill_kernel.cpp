// Causal prefill attention (MLALayer.prefill's MHA form), flash-style, for one thread or several: compiled in the
// same translation unit as mqa_kernel.cpp (mqa_kernel.py::load concatenates the two), so it uses that file's lane
// width (VL, vf, loadv/storev, hsum) and its expv, the decode kernel's exponential.
//
// Why: torch's blocked form (mla.causal_attention's fallback) is two batched GEMMs per 64 query rows with a softmax
// between; at 4 heads, d = 96 and dv = 32 those GEMMs are small and thin (20-55 GFLOP/s single-threaded), and the
// scores make a round trip through memory. Here a tile of PR query rows runs over the keys in blocks of PB with an
// online softmax, its scores and outputs never leaving registers / L1.
//
// Per head: K is transposed once into blocks [d][PB] (zero-padded past n), so one query row's PB scores are PB / VL
// vectors and the score tile is PR x PKV vector FMAs per qk value, the query value broadcast. Blocks entirely above
// the diagonal are never read; only the diagonal block (the one holding the tile's rows: PB is a multiple of PR) is
// masked, and only its key chunks up to the tile's last row are computed. fp32 throughout.
//
// Every output row depends only on its own query and keys 0..row, in a fixed order (no reduction across tiles or
// threads; the partition of work over threads never changes what a row computes), so a row's bits do not depend on
// n, on later rows, or on the thread count.

constexpr int PB = 32;                   // keys per block
constexpr int PR = 8;                    // query rows per tile
constexpr int PKV = VL == 16 ? 2 : 1;    // key vectors per score pass: PR x PKV accumulators (16 zmm of 32, 8 ymm of 16)
constexpr int PCH = PKV * VL;            // keys per score pass
static_assert(PB % PCH == 0 && PB % PR == 0, "a tile's rows lie in one key block");

static inline float hmax(vf v) {
  float h[VL];
  __builtin_memcpy(h, &v, sizeof(vf));
  for (int w = VL / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) h[i] = std::max(h[i], h[i + w]);
  return h[0];
}

// whether any of the n (a multiple of VL) values at x exceeds t: one compare per vector, the lanes tested at once
// (a per-lane test took more time than the block's exps)
static inline bool any_above(const float* x, int64_t n, float t) {
#if defined(__AVX512F__)
  __mmask16 k = 0;
  for (int64_t j = 0; j < n; j += VL) k |= _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), _mm512_set1_ps(t), _CMP_GT_OQ);
  return k != 0;
#else
  __m256 a = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += VL) a = _mm256_or_ps(a, _mm256_cmp_ps(_mm256_loadu_ps(x + j), _mm256_set1_ps(t), _CMP_GT_OQ));
  return _mm256_movemask_ps(a) != 0;
#endif
}

// One [H, n, d] operand given as up to two parts along d (e.g. q_nope and q_rot, or the expanded key's nope part and
// the latent's shared rope part, stride 0 over heads), any strides: read only when packing, so no cat is needed.
struct PrefillPart {
  const float* p;
  int64_t sh, sn, sd, d;
};

static PrefillPart prefill_part(const torch::Tensor& t, int64_t H, int64_t n) {
  TORCH_CHECK(t.dtype() == torch::kFloat32 && t.dim() == 3 && t.size(0) == H && t.size(1) == n, "fp32 [H, n, d]");
  return {t.data_ptr<float>(), t.stride(0), t.stride(1), t.stride(2), t.size(2)};
}

// scores of the tile's PR rows against keys [c, c + NV * VL) of a block (kblk: [D][PB]), times scale, into s
template <int NV>
static inline void prefill_scores(const float* qt, const float* kblk, int64_t D, int64_t c, float scale, float* s) {
  vf acc[PR][NV] = {};
  for (int64_t k = 0; k < D; ++k) {
    vf x[NV];
    for (int u = 0; u < NV; ++u) x[u] = loadv(kblk + k * PB + c + u * VL);
    const float* qk = qt + k * PR;
    for (int r = 0; r < PR; ++r)
      for (int u = 0; u < NV; ++u) acc[r][u] += qk[r] * x[u];
  }
  for (int r = 0; r < PR; ++r)
    for (int u = 0; u < NV; ++u) storev(s + r * PB + c + u * VL, acc[r][u] * scale);
}

// PR x NV accumulators over the output columns [c, c + NV * VL) for keys [0, nv) of a block: o = o * alpha + p @ v
template <int NV>
static inline void prefill_values(float* o, int64_t dv, int64_t c, const float* alpha, const float* p,
                                  const float* v, int64_t vs, int64_t nv) {
  vf acc[PR][NV];
  for (int r = 0; r < PR; ++r)
    for (int u = 0; u < NV; ++u) acc[r][u] = loadv(o + r * dv + c + u * VL) * alpha[r];
  for (int64_t j = 0; j < nv; ++j) {
    vf x[NV];
    for (int u = 0; u < NV; ++u) x[u] = loadv(v + j * vs + c + u * VL);
    for (int r = 0; r < PR; ++r) {
      const float pj = p[r * PB + j];
      for (int u = 0; u < NV; ++u) acc[r][u] += pj * x[u];
    }
  }
  for (int r = 0; r < PR; ++r)
    for (int u = 0; u < NV; ++u) storev(o + r * dv + c + u * VL, acc[r][u]);
}

// Query rows [i0, i0 + PR) of head h (rows past n repeat row n - 1 and are not stored): kt is the head's transposed
// K ([blocks][D][PB]); writes out[i, h, :] ([n, H, dv], contiguous).
static void prefill_tile(const PrefillPart* qp, int nq, int64_t h, int64_t i0, int64_t n, int64_t D, const float* kt,
                         const float* v, int64_t vs, int64_t dv, float scale, float* out, int64_t H) {
  const float NEG = -std::numeric_limits<float>::infinity();
  alignas(64) float qt[PR * 1024];   // the tile's queries, transposed: qt[k * PR + r]
  alignas(64) float s[PR * PB];      // a block's scores, then its probabilities
  float m[PR], alpha[PR];
  vf lsum[PR];
  alignas(64) float o[PR * 256];     // the tile's unnormalised outputs
  std::fill(o, o + PR * dv, 0.f);
  for (int r = 0; r < PR; ++r) {
    const int64_t i = std::min(i0 + r, n - 1);
    int64_t k = 0;
    for (int a = 0; a < nq; ++a) {
      const float* row = qp[a].p + h * qp[a].sh + i * qp[a].sn;
      for (int64_t t = 0; t < qp[a].d; ++t, ++k) qt[k * PR + r] = row[t * qp[a].sd];
    }
    m[r] = NEG, lsum[r] = vf{};
  }
  const int64_t diag = i0 / PB;
  for (int64_t b = 0; b <= diag; ++b) {
    const int64_t kb = b * PB;
    // keys of this block that any row of the tile sees, in whole vectors (the rest of the diagonal block is above
    // every row's diagonal): PKV vectors per pass, the diagonal block's last vector alone
    const int64_t nk = b < diag ? PB : std::min<int64_t>(PB, (i0 + PR - kb + VL - 1) / VL * VL);
    const float* kblk = kt + b * D * PB;
    int64_t c = 0;
    for (; c + PCH <= nk; c += PCH) prefill_scores<PKV>(qt, kblk, D, c, scale, s);
    for (; c < nk; c += VL) prefill_scores<1>(qt, kblk, D, c, scale, s);
    if (b == diag)  // key kb + j is above row i0 + r's diagonal (this also masks the zero padding past n)
      for (int r = 0; r < PR; ++r)
        for (int64_t j = std::max<int64_t>(0, i0 + r + 1 - kb); j < nk; ++j) s[r * PB + j] = NEG;
    // online softmax. Every row sees key kb of its diagonal block, so its running max is finite from block 0 on.
    // As in the decode kernel, the running max moves only when a score passes it by more than RESCALE_GAP (exp of
    // scores up to the gap above it stays far from overflow; the normalisation divides the same factor out): a
    // block then costs one compare per score vector instead of a horizontal max, and no rescale. The row sums are
    // kept per lane (lsum) and reduced once at the end.
    for (int r = 0; r < PR; ++r) {
      float* sr = s + r * PB;
      bool move = m[r] == NEG;
      if (!move) move = any_above(sr, nk, m[r] + RESCALE_GAP);
      alpha[r] = 1.f;
      if (move) {
        vf mx = loadv(sr);
        for (int64_t j = VL; j < nk; j += VL) {
          const vf y = loadv(sr + j);
          mx = mx > y ? mx : y;
        }
        const float mn = std::max(m[r], hmax(mx));
        alpha[r] = std::exp(m[r] - mn);  // exp(-inf) = 0 on block 0
        lsum[r] *= alpha[r];
        m[r] = mn;
      }
      vf sum = lsum[r];
      for (int64_t j = 0; j < nk; j += VL) {
        const vf e = expv(loadv(sr + j) - m[r]);
        storev(sr + j, e);
        sum += e;
      }
      lsum[r] = sum;
    }
    // values: keys that exist (< n) and that some row sees (<= the tile's last row)
    const int64_t nv = b < diag ? PB : std::min(i0 + PR, n) - kb;
    const float* vb = v + kb * vs;
    c = 0;
    for (; c + PCH <= dv; c += PCH) prefill_values<PKV>(o, dv, c, alpha, s, vb, vs, nv);
    for (; c < dv; c += VL) prefill_values<1>(o, dv, c, alpha, s, vb, vs, nv);
  }
  for (int r = 0; r < PR && i0 + r < n; ++r) {
    const float inv = 1.f / hsum(lsum[r]);
    float* dst = out + ((i0 + r) * H + h) * dv;
    for (int64_t c = 0; c < dv; ++c) dst[c] = o[r * dv + c] * inv;
  }
}

// softmax(q k^T * scale, causal) v per head. q = cat(q1, q2) and k = cat(k1, k2) along d (q2, k2 optional),
// each [H, n, d*] with any strides (k2 may be a stride-0 expand over heads); v [H, n, dv] (any strides, made
// contiguous along dv if it is not). Returns [n, H, dv], contiguous: the layout MLALayer.prefill's caller wants.
torch::Tensor causal_prefill(torch::Tensor q1, c10::optional<torch::Tensor> q2, torch::Tensor k1,
                             c10::optional<torch::Tensor> k2, torch::Tensor v, double scale) {
  const int64_t H = q1.size(0), n = q1.size(1);
  const PrefillPart none = {nullptr, 0, 0, 0, 0};
  const PrefillPart qp[2] = {prefill_part(q1, H, n), q2 ? prefill_part(*q2, H, n) : none};
  const PrefillPart kp[2] = {prefill_part(k1, H, n), k2 ? prefill_part(*k2, H, n) : none};
  const int64_t D = qp[0].d + qp[1].d;
  TORCH_CHECK(kp[0].d + kp[1].d == D && D <= 1024, "q and k: the same width, at most 1024");
  TORCH_CHECK(v.dtype() == torch::kFloat32 && v.dim() == 3 && v.size(0) == H && v.size(1) == n, "v: fp32 [H, n, dv]");
  if (v.stride(2) != 1) v = v.contiguous();
  const int64_t dv = v.size(2);
  TORCH_CHECK(dv % VL == 0 && dv <= 256, "dv: a multiple of lanes(), at most 256");
  auto out = torch::empty({n, H, dv}, v.options());
  if (n == 0) return out;
  const int64_t blocks = (n + PB - 1) / PB, tiles = (n + PR - 1) / PR;
  std::unique_ptr<float[]> kt(new float[H * blocks * D * PB]);  // per head: [blocks][D][PB]
  at::parallel_for(0, H, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      float* kh = kt.get() + h * blocks * D * PB;
      for (int64_t k = 0; k < D; ++k)  // zeros past n: masked anyway, but no garbage (NaN, denormals) is computed on
        std::fill(kh + ((blocks - 1) * D + k) * PB + (n - (blocks - 1) * PB), kh + ((blocks - 1) * D + k + 1) * PB, 0.f);
      for (int64_t j = 0; j < n; ++j) {
        float* dst = kh + (j / PB) * D * PB + j % PB;
        int64_t k = 0;
        for (int a = 0; a < 2; ++a) {
          const float* row = kp[a].p + h * kp[a].sh + j * kp[a].sn;
          for (int64_t t = 0; t < kp[a].d; ++t, ++k) dst[k * PB] = row[t * kp[a].sd];
        }
      }
    }
  });
  const float* vp = v.data_ptr<float>();
  const int64_t vh = v.stride(0), vs = v.stride(1);
  float* op = out.data_ptr<float>();
  // head by head, so one head's transposed K (n x d floats) stays in L2 across its tiles; any split over
  // threads gives the same bits
  at::parallel_for(0, H * tiles, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t h = w / tiles, t = w % tiles;
      prefill_tile(qp, 2, h, t * PR, n, D, kt.get() + h * blocks * D * PB, vp + h * vh, vs, dv,
                   static_cast<float>(scale), op, H);
    }
  });
  return out;
}
