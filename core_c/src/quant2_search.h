/* quant2_search.h — the q2_vq block search, included by quant2.c once per
 * instruction set with Q2_ISA (the suffix of its primitives q2_prod_* and
 * q2_argmin_*, and of the functions made here) and Q2_TARGET (the target
 * attribute its functions need) defined; the search itself is described at
 * the top of quant2.c. Every copy does the same float operations in the same
 * order, so every copy writes the same bytes. */
#define Q2_CAT2(a, b) a##b
#define Q2_CAT(a, b) Q2_CAT2(a, b)
#define Q2_FN(name) Q2_CAT(name, Q2_ISA)

/* The shortlists of a block's 32 8-vectors (ha = h * a, hh = h or NULL),
 * each at its sub-block's reference scale sref[k / 2], in three passes over
 * the vectors (each pass's vectors are independent, so their scans overlap):
 * the best seed, the best of its neighbours, that one's neighbours' D, 2D
 * and N (N[k]: made, or the table's norms) and indices (ids[k]). */
Q2_INLINE Q2_TARGET void Q2_FN(q2_shortlists_)(const q2_lists *L, const float *ha, const float *hh, const float *sref,
                                               const short **ids, const float **N, q2_work *W) {
    int w[32], p[32];
    for (int k = 0; k < 32; k++) {
        float sd[Q2_SEEDS], sd2[Q2_SEEDS], sn[Q2_SEEDS];
        const float *n = Q2_FN(q2_prod_)(&L->seed_t[0][0], Q2_SEEDS, Q2_SEEDS, L->seed_n, ha + 8 * k,
                                         hh ? hh + 8 * k : NULL, sd, sd2, sn);
        w[k] = L->seed_id[Q2_FN(q2_argmin_)(sd2, n, Q2_SEEDS, sref[k >> 1])];
    }
    for (int k = 0; k < 32; k++) {
        N[k] = Q2_FN(q2_prod_)(&L->nb_t[w[k]][0][0], Q2_LIST, Q2_LIST, L->nb_n[w[k]], ha + 8 * k, hh ? hh + 8 * k : NULL,
                               W->D[k], W->D2[k], W->N[k]);
        p[k] = Q2_FN(q2_argmin_)(W->D2[k], N[k], Q2_LIST, sref[k >> 1]);
    }
    for (int k = 0; k < 32; k++) {
        if (p[k]) { /* position 0 is w itself: its list's D and N are made already */
            w[k] = L->nb_id[w[k]][p[k]];
            N[k] = Q2_FN(q2_prod_)(&L->nb_t[w[k]][0][0], Q2_LIST, Q2_LIST, L->nb_n[w[k]], ha + 8 * k,
                                   hh ? hh + 8 * k : NULL, W->D[k], W->D2[k], W->N[k]);
        }
        ids[k] = L->nb_id[w[k]];
    }
}

/* One 256-value block x (importance h) to 73 bytes at out. */
static Q2_TARGET void Q2_FN(q2_block_)(const q2_lists *L, const float *x, const float *h, q2_work *W, uint8_t *out) {
    float ha[256], hh[256], aa[256];
    const short *ids[32];
    const float *N[32];
    int sgn[32];
    Q2_FN(q2_signs_)(x, h, aa, hh, ha, sgn);
    float sub[16], ams[16], units[16], sref[16];
    for (int g = 0; g < 16; g++) {
        float am = 0.0f;
        for (int i = 0; i < 16; i++) am = aa[16 * g + i] > am ? aa[16 * g + i] : am;
        ams[g] = am, units[g] = am / L->cmax, sref[g] = units[g] * Q2_REF;
    }
    Q2_FN(q2_shortlists_)(L, ha, h ? hh : NULL, sref, ids, N, W);
    float smax = 0.0f;
    for (int g = 0; g < 16; g++) {
        const float unit = units[g];
        sub[g] = 0.0f;
        if (ams[g] == 0.0f) continue;
        const int k0 = 2 * g, k1 = 2 * g + 1;
        int c[2 * Q2_TRIALS];
        for (int t = 0; t < Q2_TRIALS; t++) { /* the scans first (independent), then the trials' sums */
            const float s = unit * (Q2_F0 + Q2_FSTEP * (float)t);
            c[2 * t] = Q2_FN(q2_argmin_)(W->D2[k0], N[k0], Q2_LIST, s);
            c[2 * t + 1] = Q2_FN(q2_argmin_)(W->D2[k1], N[k1], Q2_LIST, s);
        }
        float best = INFINITY;
        for (int t = 0; t < Q2_TRIALS; t++) {
            const float s = unit * (Q2_F0 + Q2_FSTEP * (float)t);
            float sd = 0.0f, sn = 0.0f;
            sd += W->D[k0][c[2 * t]], sn += N[k0][c[2 * t]];
            sd += W->D[k1][c[2 * t + 1]], sn += N[k1][c[2 * t + 1]];
            const float s2 = sn > 0.0f ? sd / sn : s;
            const float err = s2 * s2 * sn - 2.0f * s2 * sd; /* + sum h a^2, the same for every trial */
            if (err < best) best = err, sub[g] = s2;
        }
        smax = sub[g] > smax ? sub[g] : smax;
    }
    memset(out, 0, FE_Q2_BYTES);
    if (!(smax > 0.0f)) return; /* e = 0: the block is zero */
    int e = (int)ceilf(8.0f * log2f(smax)) + 160;
    e = e < 1 ? 1 : e > 255 ? 255 : e;
    while (e > 1 && fe_log_scale(e - 1, 0) >= smax) e--;
    while (e < 255 && fe_log_scale(e, 0) < smax) e++;
    out[64] = (uint8_t)e;
    const float top = fe_log_scale(e, 0);
    for (int g = 0; g < 16; g++) {
        int j0 = sub[g] > 0.0f ? (int)lrintf(8.0f * log2f(top / sub[g])) : 15;
        j0 = j0 < 0 ? 0 : j0 > 15 ? 15 : j0;
        const int k0 = 2 * g, k1 = 2 * g + 1, jlo = j0 - Q2_STEPS < 0 ? 0 : j0 - Q2_STEPS,
                  jhi = j0 + Q2_STEPS > 15 ? 15 : j0 + Q2_STEPS;
        int ix[2 * (2 * Q2_STEPS + 1)];
        for (int j = jlo; j <= jhi; j++) { /* the scans first (independent) */
            const float s = fe_log_scale(e, j);
            ix[2 * (j - jlo)] = Q2_FN(q2_argmin_)(W->D2[k0], N[k0], Q2_LIST, s);
            ix[2 * (j - jlo) + 1] = Q2_FN(q2_argmin_)(W->D2[k1], N[k1], Q2_LIST, s);
        }
        int bj = j0, b0 = 0, b1 = 0;
        float best = INFINITY;
        for (int j = jlo; j <= jhi; j++) {
            const float s = fe_log_scale(e, j);
            const int a = ix[2 * (j - jlo)], b = ix[2 * (j - jlo) + 1];
            float err = 0.0f;
            err += s * s * N[k0][a] - 2.0f * s * W->D[k0][a];
            err += s * s * N[k1][b] - 2.0f * s * W->D[k1][b];
            if (err < best) best = err, bj = j, b0 = a, b1 = b;
        }
        out[65 + (g >> 1)] |= (uint8_t)(bj << (4 * (g & 1)));
        const unsigned w0 = (unsigned)ids[k0][b0] | (unsigned)(sgn[k0] & 127) << 9;
        const unsigned w1 = (unsigned)ids[k1][b1] | (unsigned)(sgn[k1] & 127) << 9;
        out[2 * k0] = (uint8_t)w0, out[2 * k0 + 1] = (uint8_t)(w0 >> 8);
        out[2 * k1] = (uint8_t)w1, out[2 * k1 + 1] = (uint8_t)(w1 >> 8);
    }
}

#undef Q2_FN
#undef Q2_CAT
#undef Q2_CAT2
#undef Q2_ISA
#undef Q2_TARGET
