// Shared by the persistent LSTM and GRU kernels (see persistent.rs). The generated prelude
// defines BATCH, TIME, HIDDEN, UNITS (hidden units per block), BLOCKS, WARPS, ROWS (batch
// rows a warp computes at once) and every tensor's strides in elements; one kernel is
// compiled per configuration.
#define THREADS (WARPS * 32)
#define FULL_WARP 0xffffffffu

typedef long long offset_t;

__device__ __forceinline__ float rnn_sigmoid(float x) {
    return 1.0f / (1.0f + expf(0.0f - x));
}

// An acquire load at device scope: what the other blocks wrote before they arrived is
// visible after it.
__device__ __forceinline__ unsigned int rnn_load_acquire(const unsigned int* address) {
    unsigned int value;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
    return value;
}

// The `round`-th (1-based) meeting of all blocks. `counter` starts at zero and only grows,
// so a block that arrives early at the next round cannot release a late one. The launch is
// cooperative, so every block is resident and the spin ends.
__device__ __forceinline__ void rnn_grid_sync(unsigned int* counter, unsigned int round) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
        const unsigned int target = round * BLOCKS;
        while (rnn_load_acquire(counter) < target) {
        }
        __threadfence();
    }
    __syncthreads();
}

// Adds each lane's partial sums over the warp; every lane ends with the totals.
template <int N>
__device__ __forceinline__ void rnn_warp_sum(float (&values)[N]) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
        for (int n = 0; n < N; ++n) {
            values[n] += __shfl_xor_sync(FULL_WARP, values[n], offset);
        }
    }
}
