// The backward recurrence in one launch, mirroring forward.cu: block `blockIdx.x` owns
// hidden units [j0, j0 + UNITS) and keeps their rows of W_h in shared memory. Going back
// from the last step, warp `w` takes ROWS batch rows at a time: its lanes split the
// hidden gradient that step t + 1 sends back (dz_{t+1}[b] . W_h[j, :]), each weight read
// once for all ROWS rows; the warp adds them up transposed (`rnn_warp_transpose_sum`), and
// the lane holding row r's and unit u's total turns it into unit j0 + u's gate gradients
// dz_t and the carried cell gradient (kept in d_c0, which only that lane touches until
// the end). The blocks meet after each step, since step t - 1 reads every
// gate gradient of step t. Last, the initial state's gradients:
// d_h0 = dz_0 . W_h^T + d_states[0, 0], d_c0 = carried + d_states[1, 0].
//
// The weight gradients are not computed here: d_xp is dz itself, d_W_h one GEMM over the
// sequence (mod.rs).

#define FOUR_H (4 * HIDDEN)
#define DS_AT(kind, t, b, j) \
    ((offset_t)(kind) * DS_S0 + (offset_t)(t) * DS_S1 + (offset_t)(b) * DS_S2 + (offset_t)(j) * DS_S3)
#define ST_AT(kind, t, b, j) \
    ((offset_t)(kind) * ST_S0 + (offset_t)(t) * ST_S1 + (offset_t)(b) * ST_S2 + (offset_t)(j) * ST_S3)
#define GA_AT(t, b, c) ((offset_t)(t) * GA_S0 + (offset_t)(b) * GA_S1 + (offset_t)(c) * GA_S2)
#define DZ_AT(t, b, c) ((offset_t)(t) * DZ_S0 + (offset_t)(b) * DZ_S1 + (offset_t)(c) * DZ_S2)
#define DH_AT(b, j) ((offset_t)(b) * DH_S0 + (offset_t)(j) * DH_S1)
#define DC_AT(b, j) ((offset_t)(b) * DC_S0 + (offset_t)(j) * DC_S1)
#define Z_ROUNDS ((FOUR_H + 31) / 32)
// The transposed sum (`rnn_warp_transpose_sum`) of ROWS * UNITS <= 32 sums: lane L holds
// sum L >> SHIFT, the hidden gradient of (row, unit) (L >> SHIFT) / UNITS, % UNITS.
#define SUMS (ROWS * UNITS)
constexpr int PADDED = rnn_pow2(SUMS);
constexpr int SHIFT = 5 - rnn_log2(PADDED);

// This lane's share of rows b0.. of dz_t . W_h[j0 + u, :], summed over the warp
// (transposed); returns this lane's total, sum `lane >> SHIFT` (the owner's of its row and
// unit, see `owner` below).
__device__ __forceinline__ float lstm_hidden_gradient(const float* dz, const float* w, int t,
                                                      int b0, int lane) {
    // dh[r * UNITS + u], padded with zeros to a power of two.
    float dh[PADDED];
#pragma unroll
    for (int n = 0; n < PADDED; ++n) {
        dh[n] = 0.0f;
    }
#pragma unroll 8
    for (int round = 0; round < Z_ROUNDS; ++round) {
        const int c = round * 32 + lane;
        if (c < FOUR_H) {
            float d[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                // Written by other blocks in the previous step: read from L2.
                d[r] = b0 + r < BATCH ? __ldcg(dz + DZ_AT(t, b0 + r, c)) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < UNITS; ++u) {
                const float weight = w[u * FOUR_H + c];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    dh[r * UNITS + u] += d[r] * weight;
                }
            }
        }
    }
    return rnn_warp_transpose_sum<PADDED>(dh, lane);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
lstm_persistent_backward(const float* __restrict__ d_states, const float* __restrict__ states,
                         const float* __restrict__ gates, const float* __restrict__ wh,
                         float* dz, float* __restrict__ d_h0, float* __restrict__ d_c0,
                         unsigned int* counter) {
    // w[u * 4H + c] = W_h[j0 + u, c]: lanes read along c.
    __shared__ float w[UNITS * FOUR_H];
    const int j0 = blockIdx.x * UNITS;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int index = threadIdx.x; index < UNITS * FOUR_H; index += THREADS) {
        const int j = j0 + index / FOUR_H;
        const int c = index % FOUR_H;
        w[index] = j < HIDDEN ? wh[(offset_t)j * WH_S0 + (offset_t)c * WH_S1] : 0.0f;
    }
    __syncthreads();
    // The (row, unit) this lane updates (`my_row == ROWS`: none).
    const int sum = lane >> SHIFT;
    const bool owner = (lane & ((1 << SHIFT) - 1)) == 0 && sum < SUMS;
    const int my_row = owner ? sum / UNITS : ROWS;
    const int my_unit = owner ? sum % UNITS : 0;
    const int j = j0 + my_unit;

    for (int step = 0; step < TIME; ++step) {
        const int t = TIME - 1 - step;
        for (int b0 = warp * ROWS; b0 < BATCH; b0 += WARPS * ROWS) {
            float dh_rec = 0.0f;
            if (step > 0) {
                dh_rec = lstm_hidden_gradient(dz, w, t + 1, b0, lane);
            }
            const int b = b0 + my_row;
            if (my_row < ROWS && b < BATCH && j < HIDDEN) {
                float dh = d_states[DS_AT(0, t + 1, b, j)];
                float dc_in = d_states[DS_AT(1, t + 1, b, j)];
                if (step > 0) {
                    dh += dh_rec;
                    dc_in += d_c0[DC_AT(b, j)];
                }
                const float i = gates[GA_AT(t, b, j)];
                const float f = gates[GA_AT(t, b, HIDDEN + j)];
                const float g = gates[GA_AT(t, b, 2 * HIDDEN + j)];
                const float o = gates[GA_AT(t, b, 3 * HIDDEN + j)];
                const float tanh_c = tanhf(states[ST_AT(1, t + 1, b, j)]);
                const float c_prev = states[ST_AT(1, t, b, j)];
                const float d_c = dc_in + dh * o * (1.0f - tanh_c * tanh_c);
                dz[DZ_AT(t, b, j)] = d_c * g * i * (1.0f - i);
                dz[DZ_AT(t, b, HIDDEN + j)] = d_c * c_prev * f * (1.0f - f);
                dz[DZ_AT(t, b, 2 * HIDDEN + j)] = d_c * i * (1.0f - g * g);
                dz[DZ_AT(t, b, 3 * HIDDEN + j)] = dh * tanh_c * o * (1.0f - o);
                d_c0[DC_AT(b, j)] = d_c * f;
            }
        }
        rnn_grid_sync(counter, step + 1);
    }

    for (int b0 = warp * ROWS; b0 < BATCH; b0 += WARPS * ROWS) {
        const float dh_rec = lstm_hidden_gradient(dz, w, 0, b0, lane);
        const int b = b0 + my_row;
        if (my_row < ROWS && b < BATCH && j < HIDDEN) {
            d_h0[DH_AT(b, j)] = dh_rec + d_states[DS_AT(0, 0, b, j)];
            d_c0[DC_AT(b, j)] = d_c0[DC_AT(b, j)] + d_states[DS_AT(1, 0, b, j)];
        }
    }
}
