//! Which form each fp32 GEMM shape runs in on cuBLAS, measured once per shape and device
//! outside windows (`cublas::matmul` measures; this module keeps the answers).
//!
//! cuBLAS's heuristics pick a slow kernel for some small shapes: at batch 8 the LSTM's
//! hidden gradient `[8, 512] @ [512, 128]` took 54 µs a step, where the same product
//! computed transposed, `(Bᵀ Aᵀ)ᵀ`, took a few (`bench/results/lstm-2026-12-01.md`). Both
//! forms are exact fp32 products; CubeCL's matmul is no candidate, since it may run f32 at
//! TF32. A shape first met inside a window runs as laid and is measured at its next
//! eager call.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::runtime::blas::Gemm;

/// How a GEMM runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// `C = A @ B` as planned.
    AsLaid,
    /// `Cᵀ = Bᵀ @ Aᵀ` into a packed `[.., n, m]` buffer, returned as its transposed view.
    Transposed,
}

/// The switch: `BURN_GRAPH_CAPTURE_GEMM_ROUTE=off` runs every GEMM as laid, unmeasured.
pub(crate) const SWITCH: &str = "BURN_GRAPH_CAPTURE_GEMM_ROUTE";

/// Whether shapes are measured (read once per process; on unless `off`).
pub(crate) fn enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var(SWITCH).map_or(true, |value| value != "off"))
}

/// The transposed form must take at most this share of the planned form's time to be
/// taken. Its output is a transposed view, which later reshapes copy (the timing does not
/// see that): at 0.8 the graphed `nn::Lstm` step at b32/t64/h256 took 17.6 ms against
/// 14.6 unrouted on the H200, while the shapes it is for run 2-10x faster transposed. A
/// wide margin also keeps noise between processes from flipping a choice (and with it
/// the rounding of its products).
const MARGIN: f64 = 0.5;

/// The form to run, from each form's measured time for the same repetitions.
pub(crate) fn choose(as_laid_ms: f64, transposed_ms: f64) -> Form {
    if transposed_ms < as_laid_ms * MARGIN {
        Form::Transposed
    } else {
        Form::AsLaid
    }
}

type Routes = Mutex<HashMap<(usize, Gemm), Form>>;

fn routes() -> &'static Routes {
    static ROUTES: std::sync::OnceLock<Routes> = std::sync::OnceLock::new();
    ROUTES.get_or_init(Routes::default)
}

/// The form measured for `gemm` on `device`, if it was.
pub(crate) fn known(device: usize, gemm: &Gemm) -> Option<Form> {
    routes()
        .lock()
        .expect("no panic holds it")
        .get(&(device, *gemm))
        .copied()
}

/// Keeps `form` for `gemm` on `device` (the first answer stays).
pub(crate) fn record(device: usize, gemm: Gemm, form: Form) -> Form {
    *routes()
        .lock()
        .expect("no panic holds it")
        .entry((device, gemm))
        .or_insert(form)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transposed_form_needs_a_clear_lead() {
        assert_eq!(choose(54.0, 5.0), Form::Transposed);
        assert_eq!(choose(10.0, 7.0), Form::AsLaid);
        assert_eq!(choose(10.0, 5.0), Form::AsLaid);
        assert_eq!(choose(10.0, 4.9), Form::Transposed);
        assert_eq!(choose(5.0, 54.0), Form::AsLaid);
    }

    #[test]
    fn the_first_answer_per_shape_and_device_stays() {
        let plan = |m| {
            Gemm::plan((&[m, 4], &[4, 1]), (&[4, 3], &[3, 1]), &[3, 1]).expect("a plain product")
        };
        // Shapes no other test uses (the table is per process).
        let (a, b) = (plan(7919), plan(7907));
        assert_eq!(known(0, &a), None);
        assert_eq!(record(0, a, Form::Transposed), Form::Transposed);
        assert_eq!(record(0, a, Form::AsLaid), Form::Transposed);
        assert_eq!(known(0, &a), Some(Form::Transposed));
        assert_eq!(known(1, &a), None);
        assert_eq!(known(0, &b), None);
    }
}
