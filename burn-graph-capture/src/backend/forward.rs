//! The forwarding macro behind `GraphCapture<B>`'s op traits.
//!
//! `ops/generated.rs` (written by `cargo run -p xtask -- gen-forward` from burn-backend's
//! trait definitions) lists every method with the kind of each argument. This macro turns
//! each line into a method that records the op while a session is open, then calls the
//! same method of `B`. Outside a session the only cost is one thread-local load.

/// Implements one op trait for `GraphCapture<B>` by forwarding to `B`.
macro_rules! forward_ops {
    (@breaker Op) => { None };
    (@breaker $class:ident) => { Some($crate::backend::session::BreakerKind::$class) };

    (@record tensor, $rec:ident, $arg:ident) => { $rec.tensor(&$arg) };
    (@record tensor_ref, $rec:ident, $arg:ident) => { $rec.tensor($arg) };
    (@record tensors, $rec:ident, $arg:ident) => { $arg.iter().for_each(|t| $rec.tensor(t)) };
    (@record opt_tensor, $rec:ident, $arg:ident) => { $rec.optional(&$arg) };
    (@record data, $rec:ident, $arg:ident) => { $rec.data(&$arg) };
    (@record relabel, $rec:ident, $arg:ident) => {
        $crate::backend::relabel::Relabel::record(&$arg, $rec)
    };
    (@record attr, $rec:ident, $arg:ident) => { $rec.attr(&$arg) };

    (@arg relabel, $arg:ident) => { $crate::backend::relabel::Relabel::to_inner($arg) };
    (@arg $kind:ident, $arg:ident) => { $arg };

    (@ret plain, $call:expr) => { $call };
    (@ret relabel, $call:expr) => { $crate::backend::relabel::Relabel::from_inner($call) };

    (
        $trait:ident;
        $(
            [$class:ident] fn $name:ident($($arg:ident: $ty:ty as $kind:ident),* $(,)?)
                -> $ret:ty as $ret_kind:ident;
        )*
    ) => {
        impl<B: Backend> $trait<GraphCapture<B>> for GraphCapture<B> {
            $(
                fn $name($($arg: $ty),*) -> $ret {
                    if $crate::backend::session::is_recording() {
                        $crate::backend::session::record_op(
                            stringify!($name),
                            forward_ops!(@breaker $class),
                            |_rec| { $(forward_ops!(@record $kind, _rec, $arg);)* },
                        );
                    }
                    forward_ops!(
                        @ret $ret_kind,
                        <B as $trait<B>>::$name($(forward_ops!(@arg $kind, $arg)),*)
                    )
                }
            )*
        }
    };
}

pub(crate) use forward_ops;
