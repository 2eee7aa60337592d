//! The forwarding macro behind `GraphCapture<B>`'s op traits.
//!
//! `ops/generated.rs` (written by `cargo run -p xtask -- gen-forward` from burn-backend's
//! trait definitions) lists every method with the kind of each argument and of its
//! result. This macro turns each line into a method that calls the same method of `B`
//! and, while a session is open, records the op: its signature, whether it breaks a
//! capture, which allocations it read and which it produced. Outside a session the
//! only cost is one thread-local load.

/// Implements one op trait for `GraphCapture<B>` by forwarding to `B`.
macro_rules! forward_ops {
    (@breaker Op) => { None };
    // Moving a tensor to the device it already sits on returns it unchanged (Fusion,
    // CubeCL): nothing crosses devices, so nothing breaks a capture.
    (@breaker DeviceTransfer($device_of:ident, $tensor:ident, $device:ident)) => {
        if &B::$device_of(&$tensor) == $device {
            None
        } else {
            Some($crate::backend::session::BreakerKind::DeviceTransfer)
        }
    };
    // Served by a trainer's device generator inside its steps (`rng::serve`).
    (@breaker DeviceRandom($shape:ident, $device:ident, $dtype:ident)) => {
        $crate::backend::random::breaker::<B>(&$shape, $device, $dtype)
    };
    (@breaker $class:ident) => { Some($crate::backend::session::BreakerKind::$class) };

    (@record tensor, $rec:ident, $arg:ident) => { $rec.tensor(&$arg) };
    // Every op taking a tensor by reference reads only its metadata (device, flags).
    (@record tensor_ref, $rec:ident, $arg:ident) => { $rec.metadata($arg) };
    (@record tensors, $rec:ident, $arg:ident) => { $arg.iter().for_each(|t| $rec.tensor(t)) };
    (@record opt_tensor, $rec:ident, $arg:ident) => { $rec.optional(&$arg) };
    (@record data, $rec:ident, $arg:ident) => { $rec.data(&$arg) };
    (@record relabel, $rec:ident, $arg:ident) => {
        $crate::backend::relabel::Relabel::record(&$arg, $rec, false)
    };
    (@record attr, $rec:ident, $arg:ident) => { $rec.attr(&$arg) };

    (@output tensor, $rec:ident, $out:ident) => { $rec.output(&$out) };
    (@output pair, $rec:ident, $out:ident) => {{
        $rec.output(&$out.0);
        $rec.output(&$out.1);
    }};
    (@output relabel, $rec:ident, $out:ident) => {
        $crate::backend::relabel::Relabel::record(&$out, &mut $rec, true)
    };
    (@output plain, $rec:ident, $out:ident) => {};

    (@arg relabel, $arg:ident) => { $crate::backend::relabel::Relabel::to_inner($arg) };
    (@arg $kind:ident, $arg:ident) => { $arg };

    // Ops the inner backend may run another way than its op trait does (`GraphBackend`).
    (@call float_matmul, $trait:ident, $lhs:expr, $rhs:expr) => {
        <B as $crate::backend::RoutedMatmul>::matmul($lhs, $rhs)
    };
    // `linear` and its multiplying gradients: `B`'s default arithmetic around that matmul.
    (@call linear, $trait:ident, $x:expr, $weight:expr, $bias:expr) => {
        $crate::backend::linear::linear::<B>($x, $weight, $bias)
    };
    (@call linear_x_backward, $trait:ident, $weight:expr, $grad:expr) => {
        $crate::backend::linear::linear_x_backward::<B>($weight, $grad)
    };
    (@call linear_weight_backward, $trait:ident, $x:expr, $grad:expr) => {
        $crate::backend::linear::linear_weight_backward::<B>($x, $grad)
    };
    (@call float_random, $trait:ident, $shape:expr, $distribution:expr, $device:expr, $dtype:expr) => {
        $crate::backend::random::float_random::<B>($shape, $distribution, $device, $dtype)
    };
    (@call $name:ident, $trait:ident, $($arg:expr),*) => { <B as $trait<B>>::$name($($arg),*) };

    (@ret relabel, $call:expr) => { $crate::backend::relabel::Relabel::from_inner($call) };
    (@ret $kind:ident, $call:expr) => { $call };

    (
        $trait:ident;
        $(
            [$class:ident $(($($detail:ident),*))?]
            fn $name:ident($($arg:ident: $ty:ty as $kind:ident),* $(,)?)
                -> $ret:ty as $ret_kind:ident;
        )*
    ) => {
        impl<B: $crate::backend::GraphBackend> $trait<GraphCapture<B>> for GraphCapture<B> {
            $(
                #[allow(unused_mut)]
                fn $name($($arg: $ty),*) -> $ret {
                    // Inputs are recorded before the call, which consumes them.
                    let recorder = $crate::backend::session::is_recording().then(|| {
                        let mut rec = $crate::backend::session::OpRecorder::default();
                        { let _rec = &mut rec; $(forward_ops!(@record $kind, _rec, $arg);)* }
                        (rec, forward_ops!(@breaker $class $(($($detail),*))?))
                    });
                    let out = forward_ops!(
                        @ret $ret_kind,
                        forward_ops!(@call $name, $trait, $(forward_ops!(@arg $kind, $arg)),*)
                    );
                    if let Some((mut rec, breaker)) = recorder {
                        forward_ops!(@output $ret_kind, rec, out);
                        rec.commit(stringify!($name), breaker);
                    }
                    out
                }
            )*
        }
    };
}

pub(crate) use forward_ops;
