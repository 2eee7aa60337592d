//! cuBLAS on the server's stream: fp32 GEMMs (no TF32) that a capture window records like
//! any kernel.
//!
//! The handle and its workspace are made at the first GEMM, outside any window: cuBLAS
//! must not allocate while a stream captures, so it gets a fixed workspace of its own
//! (`cublasSetWorkspace`, as PyTorch does) and never grows it.
//!
//! [`Gemm`] is the pure part: a row-major `[batch.., m, k] @ [batch.., k, n]` matmul on
//! strided operands, as the column-major arguments of one `cublasSgemmStridedBatched`.

use cudarc::cublas::{result as cublas, sys};
use cudarc::driver::{CudaStream, result, sys::CUdeviceptr};

use super::error::CaptureError;

/// Bytes of the workspace cuBLAS gets (what cuBLAS itself uses by default on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// The switch: `BURN_GRAPH_CAPTURE_CUBLAS=off` keeps every matmul on CubeCL's kernels.
pub const SWITCH: &str = "BURN_GRAPH_CAPTURE_CUBLAS";

/// Whether fp32 matmuls may go to cuBLAS (read once per process; on unless `off`).
pub fn enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var(SWITCH).map_or(true, |value| value != "off"))
}

/// How cuBLAS reads one operand, column-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    /// Whether cuBLAS transposes the stored matrix.
    pub transposed: bool,
    /// Leading dimension, in elements.
    pub ld: i32,
    /// Elements between consecutive matrices of the batch (0: one matrix for all).
    pub batch_stride: i64,
}

/// One strided-batched GEMM: `C = A @ B` for row-major `A: [m, k]`, `B: [k, n]` and
/// `C: [m, n]`, computed as column-major `Cᵀ = Bᵀ Aᵀ`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gemm {
    /// Rows of `A` and `C`.
    pub m: i32,
    /// Columns of `B` and `C`.
    pub n: i32,
    /// The shared dimension.
    pub k: i32,
    /// Matrices in the batch.
    pub batch: i32,
    /// The left operand `A`.
    pub a: Operand,
    /// The right operand `B`.
    pub b: Operand,
    /// The output `C` (never transposed).
    pub c: Operand,
}

/// Why a matmul is not one strided-batched GEMM; CubeCL's matmul serves it instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GemmRefusal {
    /// Ranks below 2, or operands of different ranks.
    #[error("operands of ranks {0} and {1}")]
    Rank(usize, usize),
    /// Inner dimensions that differ, or batch dimensions that do not broadcast.
    #[error("shapes {0:?} and {1:?} do not multiply")]
    Shapes(Vec<usize>, Vec<usize>),
    /// An empty dimension (CubeCL returns the empty or zero result).
    #[error("an empty dimension")]
    Empty,
    /// A matrix whose rows and columns both step by more than one element, or overlap.
    #[error("a matrix with strides {0:?} is neither row- nor column-major")]
    Layout(Vec<usize>),
    /// Batch dimensions whose strides do not collapse into one.
    #[error("batch strides {0:?} do not collapse into one stride")]
    Batch(Vec<usize>),
    /// A size or stride beyond cuBLAS's 32-bit arguments.
    #[error("a size beyond cuBLAS's 32-bit arguments")]
    TooLarge,
}

fn int(value: usize) -> Result<i32, GemmRefusal> {
    i32::try_from(value).map_err(|_| GemmRefusal::TooLarge)
}

/// How cuBLAS reads the transpose of a `[rows, cols]` matrix with strides
/// `(row_stride, col_stride)`: a unit column step is a plain column-major read of the
/// transpose, a unit row step a transposed read. Strides of length-1 dimensions do not
/// matter.
fn matrix(
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
) -> Result<(bool, i32), GemmRefusal> {
    if col_stride == 1 || cols == 1 {
        let ld = if rows == 1 { cols } else { row_stride };
        if ld >= cols {
            return Ok((false, int(ld.max(1))?));
        }
    }
    if row_stride == 1 || rows == 1 {
        let ld = if cols == 1 { rows } else { col_stride };
        if ld >= rows {
            return Ok((true, int(ld.max(1))?));
        }
    }
    Err(GemmRefusal::Layout(vec![row_stride, col_stride]))
}

/// The one stride of an operand's batch dimensions over the output's batch `shape`
/// (dimensions it broadcasts have stride 0), if they collapse into one.
fn batch_stride(shape: &[usize], own: &[usize], strides: &[usize]) -> Result<i64, GemmRefusal> {
    let mut dims = shape
        .iter()
        .zip(own.iter().zip(strides))
        .filter(|(size, _)| **size > 1)
        .map(|(size, (own, stride))| (*size, if *own == 1 { 0 } else { *stride }))
        .rev();
    let Some((mut size, innermost)) = dims.next() else {
        return Ok(0);
    };
    let mut expected = innermost;
    for (next_size, stride) in dims {
        expected *= size;
        if stride != expected {
            return Err(GemmRefusal::Batch(strides.to_vec()));
        }
        size = next_size;
    }
    i64::try_from(innermost).map_err(|_| GemmRefusal::TooLarge)
}

impl Gemm {
    /// The shape of `lhs @ rhs`: batch dimensions broadcast, then `[m, n]`.
    pub fn output_shape(lhs: &[usize], rhs: &[usize]) -> Result<Vec<usize>, GemmRefusal> {
        let rank = lhs.len();
        if rank < 2 || rhs.len() != rank {
            return Err(GemmRefusal::Rank(rank, rhs.len()));
        }
        let shapes = || GemmRefusal::Shapes(lhs.to_vec(), rhs.to_vec());
        if lhs[rank - 1] != rhs[rank - 2] {
            return Err(shapes());
        }
        let mut out = Vec::with_capacity(rank);
        for (a, b) in lhs[..rank - 2].iter().zip(&rhs[..rank - 2]) {
            out.push(match (a, b) {
                (a, b) if a == b => *a,
                (1, b) => *b,
                (a, 1) => *a,
                _ => return Err(shapes()),
            });
        }
        out.extend([lhs[rank - 2], rhs[rank - 1]]);
        Ok(out)
    }

    /// The GEMM computing `lhs @ rhs` into `out` (shapes and strides in elements), or why
    /// there is none.
    pub fn plan(
        (lhs, lhs_strides): (&[usize], &[usize]),
        (rhs, rhs_strides): (&[usize], &[usize]),
        out_strides: &[usize],
    ) -> Result<Self, GemmRefusal> {
        let shape = Self::output_shape(lhs, rhs)?;
        let rank = shape.len();
        let (m, k, n) = (lhs[rank - 2], lhs[rank - 1], rhs[rank - 1]);
        let batch: usize = shape[..rank - 2].iter().product();
        if m == 0 || k == 0 || n == 0 || batch == 0 {
            return Err(GemmRefusal::Empty);
        }
        let batch_shape = &shape[..rank - 2];
        let operand = |own: &[usize], strides: &[usize], rows, cols| {
            let (transposed, ld) = matrix(rows, cols, strides[rank - 2], strides[rank - 1])?;
            let batch_stride = batch_stride(batch_shape, &own[..rank - 2], &strides[..rank - 2])?;
            Ok::<_, GemmRefusal>(Operand {
                transposed,
                ld,
                batch_stride,
            })
        };
        let c = operand(&shape, out_strides, m, n)?;
        if c.transposed && m > 1 && n > 1 {
            return Err(GemmRefusal::Layout(out_strides[rank - 2..].to_vec()));
        }
        Ok(Self {
            m: int(m)?,
            n: int(n)?,
            k: int(k)?,
            batch: int(batch)?,
            a: operand(lhs, lhs_strides, m, k)?,
            b: operand(rhs, rhs_strides, k, n)?,
            c: Operand {
                transposed: false,
                ..c
            },
        })
    }

    /// Elements of `A`, `B` and `C` the GEMM reaches, from each one's first element: the
    /// server checks them against the buffers' sizes before it calls cuBLAS.
    pub fn extents(&self) -> [u64; 3] {
        let last = |op: &Operand, rows: i32, cols: i32| {
            // The stored column-major matrix is `ld × cols'` with `rows'` rows used.
            let (stored_rows, stored_cols) = if op.transposed {
                (rows, cols)
            } else {
                (cols, rows)
            };
            let one = (stored_cols as i64 - 1) * op.ld as i64 + stored_rows as i64;
            (one + (self.batch as i64 - 1) * op.batch_stride) as u64
        };
        [
            last(&self.a, self.m, self.k),
            last(&self.b, self.k, self.n),
            last(&self.c, self.m, self.n),
        ]
    }
}

fn op(transposed: bool) -> sys::cublasOperation_t {
    if transposed {
        sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        sys::cublasOperation_t::CUBLAS_OP_N
    }
}

/// A cuBLAS handle bound to the server's stream, with its fixed workspace.
#[derive(Debug)]
pub struct Blas {
    handle: sys::cublasHandle_t,
    workspace: CUdeviceptr,
}

// SAFETY: the handle and workspace are used only through `&mut CudaGraphServer`, so by
// one thread at a time; cuBLAS handles are not tied to the thread that made them.
unsafe impl Send for Blas {}

impl Blas {
    /// Loads cuBLAS and makes a handle on `stream` with default (non-TF32) math and host
    /// scalars. The caller's thread has the context bound, and no window is open.
    pub fn new(stream: &CudaStream) -> Result<Self, CaptureError> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(CaptureError::BlasUnavailable);
        }
        let handle =
            cublas::create_handle().map_err(|err| CaptureError::blas("cublasCreate", err))?;
        // SAFETY: a fresh allocation of the workspace's size, freed in `drop`.
        let workspace = match unsafe { result::malloc_sync(WORKSPACE_BYTES) } {
            Ok(ptr) => ptr,
            Err(err) => {
                // SAFETY: made above, not used since.
                let _ = unsafe { cublas::destroy_handle(handle) };
                return Err(CaptureError::driver("cuMemAlloc (cuBLAS workspace)", err));
            }
        };
        let blas = Self { handle, workspace };
        // SAFETY: a live handle; the stream outlives the server that owns both; the
        // workspace is a live device allocation of `WORKSPACE_BYTES`.
        unsafe {
            cublas::set_stream(handle, stream.cu_stream() as sys::cudaStream_t)
                .map_err(|err| CaptureError::blas("cublasSetStream", err))?;
            sys::cublasSetWorkspace_v2(handle, workspace as *mut _, WORKSPACE_BYTES)
                .result()
                .map_err(|err| CaptureError::blas("cublasSetWorkspace", err))?;
            sys::cublasSetMathMode(handle, sys::cublasMath_t::CUBLAS_DEFAULT_MATH)
                .result()
                .map_err(|err| CaptureError::blas("cublasSetMathMode", err))?;
            sys::cublasSetPointerMode_v2(
                handle,
                sys::cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST,
            )
            .result()
            .map_err(|err| CaptureError::blas("cublasSetPointerMode", err))?;
        }
        Ok(blas)
    }

    /// Queues `gemm` on the stream.
    ///
    /// # Safety
    /// `a`, `b` and `c` point to live fp32 buffers holding at least `gemm.extents()`
    /// elements each, which the stream keeps alive until the GEMM has run.
    pub unsafe fn sgemm(
        &self,
        gemm: &Gemm,
        a: CUdeviceptr,
        b: CUdeviceptr,
        c: CUdeviceptr,
    ) -> Result<(), CaptureError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Column-major: Cᵀ[n, m] = Bᵀ[n, k] · Aᵀ[k, m].
        // SAFETY: the caller's contract; the scalars are host values read at the call.
        unsafe {
            cublas::sgemm_strided_batched(
                self.handle,
                op(gemm.b.transposed),
                op(gemm.a.transposed),
                gemm.n,
                gemm.m,
                gemm.k,
                &alpha,
                b as *const f32,
                gemm.b.ld,
                gemm.b.batch_stride,
                a as *const f32,
                gemm.a.ld,
                gemm.a.batch_stride,
                &beta,
                c as *mut f32,
                gemm.c.ld,
                gemm.c.batch_stride,
                gemm.batch,
            )
        }
        .map_err(|err| CaptureError::blas("cublasSgemmStridedBatched", err))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: both were made in `new` and are not used after this; the stream's work
        // that reads the workspace has finished or is dropped with the context.
        unsafe {
            if let Err(err) = cublas::destroy_handle(self.handle) {
                tracing::warn!("CudaGraphRuntime: cublasDestroy failed: {err}");
            }
            if let Err(err) = result::free_sync(self.workspace) {
                tracing::warn!("CudaGraphRuntime: freeing the cuBLAS workspace failed: {err:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl_core::zspace::striding::row_major_contiguous_strides;

    fn contiguous(shape: &[usize]) -> Vec<usize> {
        row_major_contiguous_strides(shape).to_vec()
    }

    fn plan(lhs: (&[usize], &[usize]), rhs: (&[usize], &[usize])) -> Result<Gemm, GemmRefusal> {
        let out = Gemm::output_shape(lhs.0, rhs.0)?;
        Gemm::plan(lhs, rhs, &contiguous(&out))
    }

    /// The reference the plans are checked against: what the column-major call computes,
    /// element by element, from flat buffers.
    fn run(gemm: &Gemm, a: &[f32], b: &[f32]) -> Vec<f32> {
        let at = |op: &Operand, data: &[f32], batch: i32, row: i32, col: i32| {
            // Element (row, col) of op(stored), stored column-major with `ld`.
            let (r, c) = if op.transposed {
                (col, row)
            } else {
                (row, col)
            };
            data[(batch as i64 * op.batch_stride + r as i64 + c as i64 * op.ld as i64) as usize]
        };
        let len = gemm.extents()[2] as usize;
        let mut c = vec![f32::NAN; len];
        for batch in 0..gemm.batch {
            for j in 0..gemm.n {
                for i in 0..gemm.m {
                    // Cᵀ(j, i) = Σ_p op(B)(j, p) · op(A)(p, i)
                    let sum = (0..gemm.k)
                        .map(|p| at(&gemm.b, b, batch, j, p) * at(&gemm.a, a, batch, p, i))
                        .sum();
                    let idx =
                        batch as i64 * gemm.c.batch_stride + j as i64 + i as i64 * gemm.c.ld as i64;
                    c[idx as usize] = sum;
                }
            }
        }
        c
    }

    /// Row-major reference of `A @ B` over views with arbitrary strides.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        (m, k, n, batch): (usize, usize, usize, usize),
        a: &[f32],
        (a_rs, a_cs, a_bs): (usize, usize, usize),
        b: &[f32],
        (b_rs, b_cs, b_bs): (usize, usize, usize),
    ) -> Vec<f32> {
        let mut out = Vec::new();
        for t in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    out.push(
                        (0..k)
                            .map(|p| {
                                a[t * a_bs + i * a_rs + p * a_cs]
                                    * b[t * b_bs + p * b_rs + j * b_cs]
                            })
                            .sum(),
                    );
                }
            }
        }
        out
    }

    fn values(len: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect()
    }

    #[test]
    fn row_major_operands_are_plain_reads_of_their_transposes() {
        let gemm = plan((&[3, 4], &[4, 1]), (&[4, 5], &[5, 1])).unwrap();
        assert_eq!((gemm.m, gemm.n, gemm.k, gemm.batch), (3, 5, 4, 1));
        assert_eq!((gemm.a.transposed, gemm.a.ld), (false, 4));
        assert_eq!((gemm.b.transposed, gemm.b.ld), (false, 5));
        assert_eq!(gemm.c.ld, 5);
    }

    #[test]
    fn every_layout_computes_the_row_major_product() {
        let (m, k, n) = (3, 4, 5);
        // (shape strides of A as [m, k], of B as [k, n]) plain, transposed, padded rows.
        let a_layouts = [(k, 1), (1, m), (k + 3, 1), (1, m + 2)];
        let b_layouts = [(n, 1), (1, k), (n + 1, 1), (1, k + 5)];
        for a_layout in a_layouts {
            for b_layout in b_layouts {
                let a = values(m * k * 4);
                let b = values(k * n * 4);
                let gemm = plan(
                    (&[m, k], &[a_layout.0, a_layout.1]),
                    (&[k, n], &[b_layout.0, b_layout.1]),
                )
                .unwrap();
                let got = run(&gemm, &a, &b);
                let want = reference(
                    (m, k, n, 1),
                    &a,
                    (a_layout.0, a_layout.1, 0),
                    &b,
                    (b_layout.0, b_layout.1, 0),
                );
                assert_eq!(got, want, "A {a_layout:?}, B {b_layout:?}");
            }
        }
    }

    #[test]
    fn batches_collapse_and_broadcast() {
        let (m, k, n) = (2, 3, 4);
        let a = values(2 * 3 * m * k);
        let b = values(k * n);
        // A: [2, 3, m, k] contiguous; B: [1, 1, k, n] broadcast over both batch dims.
        let gemm = plan(
            (&[2, 3, m, k], &contiguous(&[2, 3, m, k])),
            (&[1, 1, k, n], &contiguous(&[1, 1, k, n])),
        )
        .unwrap();
        assert_eq!(
            (gemm.batch, gemm.a.batch_stride, gemm.b.batch_stride),
            (6, (m * k) as i64, 0)
        );
        let want = reference((m, k, n, 6), &a, (k, 1, m * k), &b, (n, 1, 0));
        assert_eq!(run(&gemm, &a, &b), want);
    }

    #[test]
    fn single_rows_and_columns_ignore_their_strides() {
        // A [1, k] taken as a row of a transposed matrix; B [k, 1] a column view.
        let gemm = plan((&[1, 4], &[1, 9]), (&[4, 1], &[7, 3])).unwrap();
        let a = values(40);
        let b = values(40);
        assert_eq!(
            run(&gemm, &a, &b),
            reference((1, 4, 1, 1), &a, (1, 9, 0), &b, (7, 3, 0))
        );
    }

    #[test]
    fn what_one_gemm_cannot_read_is_refused() {
        let refused =
            |lhs: (&[usize], &[usize]), rhs: (&[usize], &[usize])| plan(lhs, rhs).unwrap_err();
        // Both strides above one: a strided view of a strided view.
        assert!(matches!(
            refused((&[3, 4], &[8, 2]), (&[4, 5], &[5, 1])),
            GemmRefusal::Layout(_)
        ));
        // Rows overlapping (an expanded matrix).
        assert!(matches!(
            refused((&[3, 4], &[0, 1]), (&[4, 5], &[5, 1])),
            GemmRefusal::Layout(_)
        ));
        // A permuted batch: [2, 3] batch dims whose strides do not nest.
        assert!(matches!(
            refused(
                (&[2, 3, 2, 2], &[4, 8, 2, 1]),
                (&[2, 3, 2, 2], &contiguous(&[2, 3, 2, 2]))
            ),
            GemmRefusal::Batch(_)
        ));
        assert!(matches!(
            refused((&[3, 4], &[4, 1]), (&[5, 2], &[2, 1])),
            GemmRefusal::Shapes(..)
        ));
        assert!(matches!(
            refused((&[3, 0], &[1, 1]), (&[0, 2], &[2, 1])),
            GemmRefusal::Empty
        ));
        assert!(matches!(
            refused((&[4], &[1]), (&[4], &[1])),
            GemmRefusal::Rank(1, 1)
        ));
    }

    #[test]
    fn extents_bound_every_element_the_gemm_reads() {
        let gemm = plan((&[2, 3, 4], &[20, 1, 3]), (&[2, 4, 5], &[0, 5, 1])).unwrap();
        let [a, b, c] = gemm.extents();
        // A: last batch at 20, last element (row 2, col 3) at 2 + 3*3 = 11.
        assert_eq!(a, 20 + 11 + 1);
        // B broadcast: one matrix of 20.
        assert_eq!(b, 20);
        assert_eq!(c, 2 * 3 * 5);
    }
}
